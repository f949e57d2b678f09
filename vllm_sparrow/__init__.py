"""vllm-sparrow: Sparrow speculative decoding for video LLMs, as a vLLM plugin.

The paper's parts live in separate places:
  draft model and its text-only window cache:  model.py, window.py, attention.py, drafter.py
                                               (kernels: vllm_sparrow_kernels)
  drafting strategies (chain, tree, graphs):   drafting/
  training (capture, IVSB, MTP):               training/
  the vLLM glue:                               plugin.py (picks the glue per release);
                                               serving_draft.py, method_config.py (both runners);
                                               patches.py, patch_helper.py (vLLM touches, checked)
    V1 runner (0.32, 0.33)                     v1_runner/
    V2 runner (0.34)                           v2_runner/
The demo kit (synthetic world, demo models, benchmark) is the separate package sparrow_world,
which this one never imports. Importing this package touches neither vLLM nor CUDA.
"""

__version__ = "0.1.0"
# The vLLM releases the plugin serves on, by the model runner its glue is written for (plugin.py
# picks the glue; on any other release it logs one line and steps aside):
#   V1 runner (0.32, 0.33): patches.py's table adds the method (v1_runner/)
#   V2 runner (0.34): vLLM's registry of speculative methods (v2_runner/), nothing patched
# Each is checked from its source by tools/vllm_source_check.py (tests/test_patch_targets_exist_in_
# vllm_source.py); the CPU build is released for 0.32.0 only.
V1_RUNNER_VERSIONS = ("0.32.0", "0.33.0")
V2_RUNNER_VERSIONS = ("0.34.0",)  # run on a real 0.34 engine only in the CPU stand-in (make test-vllm034)
SUPPORTED_VLLM_VERSIONS = V1_RUNNER_VERSIONS + V2_RUNNER_VERSIONS
# The serving glue's logger: a child of vLLM's "vllm" logger, so its lines (which glue registered,
# the draft loaded with its cache, what was patched) go wherever vLLM's own go, at vLLM's level and
# through its handler (VLLM_LOGGING_LEVEL, VLLM_CONFIGURE_LOGGING, VLLM_LOGGING_CONFIG_PATH). A logger
# outside that tree has no handler in a vLLM process and its INFO lines are dropped.
LOGGER = "vllm.sparrow"
