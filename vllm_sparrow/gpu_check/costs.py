"""Part 4: the costs depth and tree decisions need, measured on this device at 7B shapes.

Relative to a one-token step of the target (its decode step without speculation: B requests, one
row each, at the context):
  v   one more verified token: the target's verify step at L = 1 + drafts rows per request,
      (t(L) - t(1)) / (L - 1) / t(1), per batch size and context (at every measured L: on a GPU
      it is not constant, flat until the step turns compute-bound)
  d   one more draft forward: the draft step (every request decoding, in its CUDA graph) at depth
      K and at depth 1, (t(K) - t(1)) / (K - 1) / t_target(1); and one chained forward alone at
      width w (w rows per request: what tree search runs at each level), d_w = t / t_target(1)
A chain of depth k then costs about 1 + k v + k d of a one-token step, a tree of N nodes at depth D
1 + N v + D d (training/depth.py). The draft never reads visual positions, so its step is measured
once per batch size and set against the target's step at every context.
"""

from __future__ import annotations

import torch

from ..attention import select_backend
from ..drafting.chain import CHAIN, ChainDrafting
from ..drafting.graphs import DecodeGraphs, GraphDrafting
from ..drafting.step import greedy
from ..drafting.tree import BranchKeys
from ..window import WindowBatch
from .shapes import CheckShapes
from .target_step import RandomTarget, time_step
from .timer import measure_ms
from .workload import RandomTokenIO, Requests, make_drafter, random_draft

KV_BUDGET = 40 << 30  # per-layer target caches up to 40 GiB in all, shared beyond (target_step.py)


def draft_step_ms(s: CheckShapes, model, io, B: int, K: int, device: torch.device, capture: bool) -> float:
    """ms of one decode draft step of B requests drafting K tokens (from its CUDA graph when capture)."""
    steps = s.timing_repeats + 3
    max_text = s.text_tokens + (steps + 2) * (K + 1)
    drafter = make_drafter(s, model, io, select_backend(device), device, s.dtype, B, max_text, num_draft=K)
    drafting = GraphDrafting(DecodeGraphs(drafter, K, [B], capture=capture), ChainDrafting())
    reqs = Requests(s, device, s.dtype, seed=B, k=K)
    rids = [f"r{i}" for i in range(B)]
    for rid in rids:
        reqs.join(rid, s.text_tokens)
    CHAIN.step(drafter, reqs.step(rids), K)  # the prompts, prefilled in one packed step
    drafting.capture()
    batches = iter([reqs.step(rids) for _ in range(steps)])  # built before timing: the runner's work
    return measure_ms(lambda: drafting.step(drafter, next(batches), K, greedy), device, s.timing_repeats, warmup=3)


def chained_forward_ms(s: CheckShapes, model, io, B: int, width: int, device: torch.device) -> float:
    """ms of one tree-search level of `width` rows per request (drafting/tree.py: each row at the
    request's next text index over its committed keys and its branch's own), with its LM head and
    the children's top-k: what a search pays per level, where a chain pays one row."""
    drafter = make_drafter(s, model, io, select_backend(device), device, s.dtype, B, s.text_tokens + 16)
    reqs = Requests(s, device, s.dtype, seed=B + width)
    rids = [f"r{i}" for i in range(B)]
    for rid in rids:
        reqs.join(rid, s.text_tokens)
    with torch.inference_mode():
        c = drafter.commit(reqs.step(rids), s.k)
        keys = BranchKeys(drafter.cache, c.slots, c.committed, c.rows, width, s.k, c.state.dtype)
        wb = WindowBatch(c.slots, c.committed[:, None].repeat(1, width), c.drafting[:, None].expand(B, width),
                         c.committed)
        y = c.state[:, None].repeat(1, width, 1).reshape(B * width, -1)  # [B * w, H]
        tokens = torch.zeros(B, width, dtype=torch.long, device=device)

        def level():
            h = drafter.forward(y, tokens, wb, lambda q, k, v: keys.attend(1, q, k, v))  # [B * w, H]
            return drafter.io.logits(h).float().log_softmax(-1).topk(width, -1)

        return measure_ms(level, device, s.timing_repeats)


def run(s: CheckShapes, device: torch.device) -> dict:
    capture = device.type == "cuda"
    model, io = random_draft(s, device, s.dtype), RandomTokenIO(s, device, s.dtype)
    draft = {}
    for B in s.batches:
        draft[B] = {"draft_step_ms": {K: draft_step_ms(s, model, io, B, K, device, capture) for K in (1, s.k)},
                    "chained_forward_ms": {w: chained_forward_ms(s, model, io, B, w, device) for w in s.draft_widths}}
    target, rows = RandomTarget(s, device), []
    for context in s.contexts:
        for B in s.batches:
            kv = target.caches(B, context, KV_BUDGET)
            verify = {L: time_step(target, B, context, L, s.timing_repeats, KV_BUDGET, kv) for L in s.verify_rows}
            rows.append(relative_costs(s, B, context, verify, draft[B]))
            del kv
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return {"graphed": capture, "rows": rows, "passed": True}


def relative_costs(s: CheckShapes, B: int, context: int, verify: dict, draft: dict) -> dict:
    """One (batch, context) row: times, and v and d relative to the one-token step."""
    one = verify[1]["target_ms"]
    steps = draft["draft_step_ms"]
    return {"batch": B, "context": context, "target_ms": {str(L): r["target_ms"] for L, r in verify.items()},
            "cuda_graph": all(r["cuda_graph"] for r in verify.values()),
            "attention": verify[s.verify_rows[-1]]["attention"],
            "draft_step_ms": {str(K): ms for K, ms in steps.items()},
            "chained_forward_ms": {str(w): ms for w, ms in draft["chained_forward_ms"].items()},
            "verify_token_cost": {str(L): (r["target_ms"] - one) / (L - 1) / one for L, r in verify.items() if L > 1},
            "draft_forward_cost": (steps[s.k] - steps[1]) / (s.k - 1) / one,
            "chained_forward_cost": {str(w): ms / one for w, ms in draft["chained_forward_ms"].items()},
            "draft_step_over_target": steps[s.k] / verify[min(s.verify_rows, key=lambda L: abs(L - s.k - 1))]["target_ms"]}
