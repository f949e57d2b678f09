"""Part 4: the draft's memory at vLLM's GPU defaults, and the peak of mixed steps.

The drafter is sized as the proposer sizes it in a default engine (max_num_seqs slots, text
positions up to the model length): the bytes it allocates (the serving layer's fused weights,
window cache, RoPE table, per-slot state; the draft model it is built from is not counted), and
the window cache's share by its formula. Then vLLM's memory profile of the draft
(profile_step at the engine's step budget, the run vLLM measures before it sizes its KV cache)
and real mixed steps (prompt chunks joining many decodes): each mixed step's peak must stay
within the profiled one, or vLLM's KV cache would be sized for less than the draft takes.
On CPU the allocator keeps no statistics: the steps run, the bytes are not measured.
"""

from __future__ import annotations

import torch

from ..attention import select_backend
from ..window import TextWindowCache, WindowSpec
from .shapes import CheckShapes
from .workload import RandomTokenIO, Requests, make_drafter, random_draft

MIB = 1 << 20


class Meter:
    """Allocated bytes and the peak above a starting point (CUDA; None elsewhere)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def now(self) -> int | None:
        return torch.cuda.memory_allocated() if self.cuda else None

    def start(self) -> int | None:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        return self.now()

    def peak_above(self, base: int | None) -> int | None:
        if not self.cuda:
            return None
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base


def mib(n: int | None) -> float | None:
    return None if n is None else round(n / MIB, 1)


def run(s: CheckShapes, device: torch.device) -> dict:
    meter = Meter(device)
    model, io = random_draft(s, device, s.dtype), RandomTokenIO(s, device, s.dtype)
    base = meter.start()
    drafter = make_drafter(s, model, io, select_backend(device), device, s.dtype, s.max_requests, s.max_text_tokens)
    resident = None if base is None else meter.now() - base
    cache_bytes = TextWindowCache.bytes_needed(WindowSpec(s.anchors, s.window), s.max_requests, s.k,
                                               s.max_text_tokens, s.kv_heads, s.head_dim, s.dtype)
    base = meter.start()
    drafter.profile_step(s.step_tokens, s.max_requests, s.k)
    profiled = meter.peak_above(base)
    steps = [mixed_step(s, drafter, device, meter, *m) for m in s.mixed_steps]
    covered = all(st["peak_mib"] is None or st["peak_mib"] <= mib(profiled) for st in steps)
    return {"max_requests": s.max_requests, "max_text_tokens": s.max_text_tokens,
            "resident_mib": mib(resident), "window_cache_mib": mib(cache_bytes),
            "profile_step_tokens": s.step_tokens, "profile_peak_mib": mib(profiled),
            "mixed_steps": steps, "passed": covered}


def mixed_step(s: CheckShapes, drafter, device: torch.device, meter: Meter, decodes: int, chunk: int,
               chunk_text: int) -> dict:
    """`decodes` requests decoding while a prompt chunk of `chunk` rows (`chunk_text` of them
    text, the rest visual placeholders) joins: the peak bytes of that step's draft work."""
    reqs = Requests(s, device, s.dtype, seed=decodes)
    rids = [f"d{i}" for i in range(decodes)]
    for rid in rids:
        reqs.join(rid, 8)
    drafter.step(reqs.step(rids), s.k)  # their prompts
    drafter.step(reqs.step(rids), s.k)  # a decode step: now they verify K drafts each
    reqs.join("chunk", chunk, chunk_text)
    batch = reqs.step(rids + ["chunk"])
    base = meter.start()
    drafter.step(batch, s.k)
    peak = meter.peak_above(base)
    drafter.release(rids + ["chunk"])
    return {"decodes": decodes, "chunk_rows": chunk, "chunk_text_rows": chunk_text, "peak_mib": mib(peak)}
