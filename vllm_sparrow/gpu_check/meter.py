"""Bytes a piece of draft work allocates: CUDA's allocator statistics on a GPU, and elsewhere a size
model that counts the storage of every tensor the work creates while it lives (exact for what
torch allocates inside the measured code, on the CPU and on the meta device, where 7B shapes at
1,024 requests cost nothing to run).

Both answer the same two questions: how much a piece of work leaves allocated (`held`), and the
highest allocation above where it started (`peak`).
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

MIB = 1 << 20


@dataclass
class Measured:
    held: int = 0  # bytes still allocated when the work ended (CUDA: reserved, graph pools included)
    peak: int = 0  # highest bytes allocated above the start while it ran


class SizeModel(TorchDispatchMode):
    """Live bytes of the storages created by ops run under it: a storage counts from the op that
    made it until the last tensor seen using it is freed (views keep their base's storage)."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: dict[int, int] = {}  # storage -> live tensors seen using it
        self.size: dict[int, int] = {}  # storage -> bytes
        self.live = self.peak = 0

    def _release(self, key: int) -> None:
        self.refs[key] -= 1
        if self.refs[key] == 0:
            del self.refs[key]
            self.live -= self.size.pop(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        # An output on an input's storage (a view, an in-place op) allocated nothing: counted only
        # when that storage is one this model counts already.
        inputs = {t.untyped_storage()._cdata for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                key = t.untyped_storage()._cdata
                if key in inputs and key not in self.refs:
                    continue  # a view of memory allocated before the measurement
                if key not in self.refs:
                    self.refs[key], self.size[key] = 0, t.untyped_storage().nbytes()
                    self.live += self.size[key]
                    self.peak = max(self.peak, self.live)
                self.refs[key] += 1
                weakref.finalize(t, self._release, key)
        return out


class Meter:
    """Measures work on `device`: `with meter.measure() as m: ...` fills m (a Measured)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = torch.device(device).type == "cuda"
        self.kind = "cuda allocator" if self.cuda else "size model"

    @contextmanager
    def measure(self):
        m = Measured()
        if self.cuda:
            # Free cached blocks are returned first and last, so `held` is what the work keeps:
            # its tensors and the private pools of the CUDA graphs it captured.
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            alloc0, reserved0 = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
            yield m
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            m.peak = torch.cuda.max_memory_allocated() - alloc0
            m.held = torch.cuda.memory_reserved() - reserved0
            return
        with SizeModel() as model:
            yield m
        m.peak, m.held = model.peak, model.live


def mib(n: int | None) -> float | None:
    return None if n is None else round(n / MIB, 2)
