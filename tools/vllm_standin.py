"""The stand-in's own shims: what vLLM 0.34's Python needs to run its sampling paths under Triton's
interpreter on this CPU. Part of the stand-in build (tools/vllm_side_env.py installs this file as
`sitecustomize.py` in the side folder, so every process of `make test-v2-runner` loads it, the
engine's and the server's included), never of the product, and active only under
TRITON_INTERPRET=1. Each swap replaces a Triton path the interpreter cannot run with the torch
computation of the same thing, once the vLLM module that holds it is imported:

  rejection_sampler_utils.tldevice.log1p   libdevice does not run under the interpreter (the
                                           probabilistic resample of a rejected draft:
                                           log(1 - q/p)); here log(1 + x), the same value in
                                           float32 but where x is below float32's epsilon
  topk_topp_sampler.apply_top_k_top_p_triton
                                           the Triton top-k / top-p kernel dies under the
                                           interpreter and takes the engine with it; here vLLM's
                                           own torch implementation (apply_top_k_top_p_pytorch)

What the stand-in still cannot run is listed in LIMITS (printed by `make test-v2-runner`, and in
docs/verified-where.md).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

LIMITS = (
    "CUDA graphs and torch.compile: the engine needs --enforce-eager (it dies at start-up without)",
    "structured outputs (guided decoding): the request errors and the next one hangs",
    "async scheduling and adaptive verification: the CPU platform turns them off (full CUDA graphs needed)",
)


def _log1p(module) -> None:
    global tl  # a jitted function must see triton.language among its module's globals
    from vllm.triton_utils import tl, triton

    @triton.jit
    def log1p(x):
        return tl.log(1.0 + x)

    class Libdevice:
        def __getattr__(self, name):
            raise AttributeError(f"the vLLM 0.34 stand-in has no interpretable libdevice.{name}")

    shim = Libdevice()
    shim.log1p = log1p
    module.tldevice = shim


def _top_k_top_p(module) -> None:
    def apply_top_k_top_p_triton(logits, k, p, has_topp_only_rows: bool = True):
        return module.apply_top_k_top_p_pytorch(logits, k, p, allow_cpu_sync=True)

    module.apply_top_k_top_p_triton = apply_top_k_top_p_triton  # what apply_top_k_top_p calls


SWAPS = {
    "vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils": _log1p,
    "vllm.v1.sample.ops.topk_topp_sampler": _top_k_top_p,
}


class _SwapAfterImport(importlib.abc.MetaPathFinder):
    """Finds the modules of SWAPS with the other finders and applies the swap once each has run."""

    def find_spec(self, name, path=None, target=None):
        swap = SWAPS.get(name)
        if swap is None:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            swap(module)

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("TRITON_INTERPRET") == "1" and not any(isinstance(f, _SwapAfterImport) for f in sys.meta_path):
    sys.meta_path.insert(0, _SwapAfterImport())
