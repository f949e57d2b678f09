"""Part 3: a draft step's time against the target's verify step, at 7B shapes, per batch size
and target context.

The draft step: B decoding requests, each with `text_tokens` text entries in its window cache,
commit K + 1 target states and draft K tokens, eagerly and (CUDA) replayed from its graph. The
draft never reads visual positions, so its step does not depend on the video's length: it is
measured once per batch size and set against the target's step at every context. The target
step: target_step.RandomTarget, B x (K + 1) tokens over `context` cached tokens per request.
"""

from __future__ import annotations

import torch

from ..attention import select_backend
from ..drafting.chain import ChainDrafting
from ..drafting.graphs import DecodeGraphs, GraphDrafting
from ..drafting.step import greedy
from .shapes import CheckShapes
from .target_step import RandomTarget, time_step
from .timer import measure_ms
from .workload import RandomTokenIO, Requests, make_drafter, random_draft

KV_BUDGET = 40 << 30  # per-layer target caches up to 40 GiB in all, shared beyond (target_step.py)


def draft_step_ms(s: CheckShapes, B: int, device: torch.device, capture: bool) -> dict:
    """ms of one decode draft step of B requests, eager and (when capture) from its graph."""
    model, io = random_draft(s, device, s.dtype), RandomTokenIO(s, device, s.dtype)
    steps = s.timing_repeats + 3
    max_text = s.text_tokens + (steps + 2) * (s.k + 1)
    out = {"batch": B}
    for name in ("eager", "graph") if capture else ("eager",):
        drafter = make_drafter(s, model, io, select_backend(device), device, s.dtype, B, max_text)
        drafting = (GraphDrafting(DecodeGraphs(drafter, s.k, [B], capture=True), ChainDrafting())
                    if name == "graph" else ChainDrafting())
        reqs = Requests(s, device, s.dtype, seed=B)
        rids = [f"r{i}" for i in range(B)]
        for rid in rids:
            reqs.join(rid, s.text_tokens)
        drafter.step(reqs.step(rids), s.k)  # the prompts, prefilled in one packed step
        if name == "graph":
            drafting.graphs.capture()
        batches = iter([reqs.step(rids) for _ in range(steps)])  # built before timing: the runner's work
        out[f"draft_{name}_ms"] = measure_ms(lambda: drafter.step(next(batches), s.k, greedy, drafting), device,
                                             s.timing_repeats, warmup=3)
    return out


def run(s: CheckShapes, device: torch.device) -> dict:
    capture = device.type == "cuda"
    drafts = {B: draft_step_ms(s, B, device, capture) for B in s.batches}
    target = RandomTarget(s, device)
    rows = []
    for context in s.contexts:
        for B in s.batches:
            t = time_step(target, B, context, s.timing_repeats, KV_BUDGET)
            d = drafts[B]
            best = d.get("draft_graph_ms", d["draft_eager_ms"])
            rows.append({**t, **d, "draft_over_target": best / t["target_ms"]})
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return {"rows": rows, "passed": True}
