"""Triton kernels of the Sparrow draft, each beside its plain torch reference.

Installed as the package `vllm_sparrow_kernels` (setup.py maps this folder), so it cannot clash
with other top-level `kernels` packages.

  window_attention.py       cache write + text-anchored window attention over the paged cache
  window_attention_ref.py   the same two operations in plain torch (the tests' reference)
"""
