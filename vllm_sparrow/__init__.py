"""vllm-sparrow: Sparrow speculative decoding for video LLMs, as a vLLM plugin.

The paper's parts live in separate places:
  draft model and its text-only window cache:  model.py, window.py, attention.py, drafter.py
                                               (kernels: vllm_sparrow_kernels)
  drafting strategies (chain, tree, graphs):   drafting/
  training (capture, IVSB, MTP):               training/
  the vLLM glue:                               plugin.py (picks the glue per release);
                                               serving_draft.py, method_config.py (both runners);
                                               patches.py, patch_helper.py (vLLM touches, checked)
    the releases, each with its runner         releases.py
    V1 runner's glue                           v1_runner/
    V2 runner's glue (Model Runner V2)         v2_runner/
The demo kit (synthetic world, demo models, benchmark) is the separate package sparrow_world,
which this one never imports. Importing this package touches neither vLLM nor CUDA.
"""

__version__ = "0.1.0"
# The vLLM releases the plugin serves on, one row each, and the model runner each one's glue is written
# for: releases.py (plugin.py picks the glue by it; on any other release it logs one line and steps aside).

# The serving glue's logger: a child of vLLM's "vllm" logger, so its lines (which glue registered,
# the draft loaded with its cache, what was patched) go wherever vLLM's own go, at vLLM's level and
# through its handler (VLLM_LOGGING_LEVEL, VLLM_CONFIGURE_LOGGING, VLLM_LOGGING_CONFIG_PATH). A logger
# outside that tree has no handler in a vLLM process and its INFO lines are dropped.
LOGGER = "vllm.sparrow"
