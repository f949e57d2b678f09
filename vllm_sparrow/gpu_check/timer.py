"""Wall time of a step on the device: warm-up calls, then the mean of `repeats` calls between
two device synchronisations (CUDA work is asynchronous: a host timer alone would time launches)."""

from __future__ import annotations

import time

import torch


def measure_ms(fn, device: torch.device, repeats: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync()
    return (time.perf_counter() - t0) * 1e3 / repeats
