"""Part 2: the decode step replayed from CUDA graphs drafts what the eager drafter drafts, at the
shipped depth (K = 8) and the buckets serving captures (drafting/graphs.default_buckets: up to
256 requests).

Three drafters of one random draft take the same engine steps in lockstep: the eager drafter
(ChainDrafting), the graph path's static buffers run eagerly (capture off: the code CPU tests
run) and, on CUDA, the same buffers captured and replayed. Requests come and go every step: one
or more leave (their slots freed), and every other step newcomers join with their prompts (text
and video, packed rows: the graph path falls back to eager there), taking the freed slots; the
steps between are decode-only and draft for a random subset of the live requests, so the batch,
its bucket and its padding change every step, up to the largest bucket.

Pass/fail: captured == static-buffer drafts always (same kernels, same shapes: any difference is
the capture); eager == graph drafts in fp32. In bf16 a bucket pads the batch, so GEMMs run with
other row counts and may round differently; a flipped near-tie there is not a bug, so bf16's
eager agreement is reported, not judged.
"""

from __future__ import annotations

import torch

from ..attention import select_backend
from ..drafting.chain import CHAIN, ChainDrafting
from ..drafting.graphs import DecodeGraphs, GraphDrafting, default_buckets
from ..drafting.step import greedy
from .shapes import CheckShapes
from .workload import RandomTokenIO, Requests, make_drafter, random_draft


def lockstep(s: CheckShapes, device: torch.device, dtype: torch.dtype, capture: bool) -> dict:
    model, io = random_draft(s, device, dtype), RandomTokenIO(s, device, dtype)
    backend = select_backend(device)
    max_text = 6 * s.text_tokens + s.graph_steps * (s.k + 1)
    buckets = default_buckets(s.graph_requests)
    make = lambda: make_drafter(s, model, io, backend, device, dtype, s.graph_requests, max_text)  # noqa: E731
    eager = make()
    paths = {}  # name -> (drafter, its GraphDrafting)
    for name, on in (("static", False), ("captured", True)):
        if on and not capture:
            continue
        drafter = make()
        paths[name] = (drafter, GraphDrafting(DecodeGraphs(drafter, s.k, buckets, on), ChainDrafting()))
        paths[name][1].capture()  # a no-op without capture
    reqs = Requests(s, device, dtype, seed=11)
    decode_sizes, differs = set(), {name: [] for name in ("eager_vs_static", "eager_vs_captured",
                                                           "static_vs_captured")}
    joined = left = 0
    for step in range(s.graph_steps):
        gone = _leave(reqs, step)
        for d in [eager] + [d for d, _ in paths.values()]:
            d.release(gone)
        left += len(gone)
        rids, new = _next_batch(s, reqs, step)
        joined += new
        batch = reqs.step(rids)
        if batch.decode_only:
            decode_sizes.add(len(rids))
        ids = {"eager": CHAIN.step(eager, batch, s.k).ids}
        for name, (drafter, drafting) in paths.items():
            ids[name] = drafting.step(drafter, batch, s.k, greedy).ids
        for pair in differs:
            a, b = pair.split("_vs_")
            if a in ids and b in ids and not torch.equal(ids[a], ids[b]):
                differs[pair].append(step)
        reqs.took(rids, ids["eager"])
    graphs = paths["static"][1].graphs
    exact = not differs["static_vs_captured"] and (dtype != torch.float32 or not (
        differs["eager_vs_static"] or differs["eager_vs_captured"]))
    return {"dtype": str(dtype).replace("torch.", ""), "k": s.k, "steps": s.graph_steps, "captured": capture,
            "buckets": buckets, "joined": joined, "left": left, "decode_batch_sizes": sorted(decode_sizes),
            "graph_steps": graphs.replays,
            "buckets_replayed": sorted({graphs.bucket(b) for b in decode_sizes if graphs.bucket(b)}),
            "steps_differing": differs, "passed": exact and graphs.replays > 0}


def _leave(reqs: Requests, step: int) -> list[str]:
    """Requests that finish before this step: one or more of the decoding ones, every step."""
    decoding = reqs.decoding()
    if not decoding:
        return []
    gone = reqs.rnd.sample(decoding, max(1, len(decoding) // 16) if step % 5 else max(1, len(decoding) // 3))
    for rid in gone:
        reqs.leave(rid)
    return gone


def _next_batch(s: CheckShapes, reqs: Requests, step: int) -> tuple[list[str], int]:
    """Even steps: newcomers join (text and video prompts) beside a random share of the decoding
    requests, filling the room the leavers made (the first ones fill it all); odd steps: a random
    subset of the decoding requests, from one to all, every third of them all (bucket sizes up to
    the largest)."""
    rnd, decoding = reqs.rnd, reqs.decoding()
    room = s.graph_requests - len(reqs.live)
    if step % 2 == 0 and room > 0 or not decoding:
        count = room if step == 0 else rnd.randint(1, max(1, room))
        new = []
        for i in range(count):
            text = rnd.randint(4, s.text_tokens)
            video = rnd.random() < 0.5
            rid = f"s{step}r{i}"
            reqs.join(rid, text + (rnd.randint(1, 4 * s.text_tokens) if video else 0), text)
            new.append(rid)
        return new + rnd.sample(decoding, rnd.randint(0, len(decoding))), len(new)
    size = len(decoding) if step % 6 == 1 else rnd.randint(1, len(decoding))  # now and then all of them
    return rnd.sample(decoding, size), 0


def run(s: CheckShapes, device: torch.device) -> dict:
    capture = device.type == "cuda"
    dtypes = list(dict.fromkeys([torch.float32, s.dtype]))
    runs = [lockstep(s, device, dt, capture) for dt in dtypes]
    return {"runs": runs, "passed": all(r["passed"] for r in runs)}
