"""vllm-sparrow: Sparrow speculative decoding for video LLMs, as a vLLM plugin.

The paper's parts live in separate places:
  draft model and its text-only window cache:  model.py, window.py, attention.py, drafter.py,
                                               tree_search.py (kernels: vllm_sparrow_kernels)
  training (capture, IVSB, MTP):               training/
  the vLLM glue:                               proposer.py, plugin.py, patches.py (the one table of
                                               vLLM touches: method_patches.py, vllm_reads.py,
                                               vllm_fixes.py, through patch_helper.py)
The demo kit (synthetic world, demo models, benchmark) is the separate package sparrow_world,
which this one never imports. Importing this package touches neither vLLM nor CUDA.
"""

__version__ = "0.1.0"
# The vLLM releases the plugin registers on (patches.check_vllm_version); on any other it steps
# aside. Each is checked from its source by tools/vllm_source_check.py (tests/test_patch_targets_
# exist_in_vllm_source.py); the CPU build is released for 0.32.0 only.
SUPPORTED_VLLM_VERSIONS = ("0.32.0", "0.33.0")
