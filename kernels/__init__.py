"""Triton kernels of the Sparrow draft, each beside its plain torch reference.

Installed as the package `vllm_sparrow_kernels` (setup.py maps this folder), so it cannot clash
with other top-level `kernels` packages.

  window_attention.py              text-anchored window attention over the ring cache, cache
                                   write folded in ([B, L] layouts: decode and chained forwards)
  window_attention_ref.py          the same in plain torch (the tests' reference, the CPU path),
                                   and the packed-row store of steps with prompt chunks
  request_noise.py                 Exp(1) noise keyed by request (seed, position, column): the
                                   draws of sampled drafts, one launch per drafted position
  request_noise_ref.py             the same hash in plain torch (the CPU path, the reference)
"""
