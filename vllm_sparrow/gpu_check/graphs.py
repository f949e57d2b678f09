"""Part 2: the decode step replayed from CUDA graphs drafts what the eager drafter drafts.

Three drafters of one random draft take the same engine steps in lockstep: the eager drafter
(ChainDrafting), the graph path's static buffers run eagerly (capture off: the code CPU tests
run) and, on CUDA, the same buffers captured and replayed. Steps mix prompts joining (text and
video, packed rows: the graph path falls back to eager there) with decode-only steps whose batch
size changes every step, so buckets from 1 to the largest are replayed with padding requests,
stale rows and slots reused after requests finish.

Pass/fail: captured == static-buffer drafts always (same kernels, same shapes: any difference is
the capture); eager == graph drafts in fp32. In bf16 a bucket pads the batch, so GEMMs run with
other row counts and may round differently; a flipped near-tie there is not a bug, so bf16's
eager agreement is reported, not judged.
"""

from __future__ import annotations

import torch

from ..attention import select_backend
from ..drafting.chain import ChainDrafting
from ..drafting.graphs import DecodeGraphs, GraphDrafting
from ..drafting.step import greedy
from .shapes import CheckShapes
from .workload import RandomTokenIO, Requests, make_drafter, random_draft


def lockstep(s: CheckShapes, device: torch.device, dtype: torch.dtype, capture: bool) -> dict:
    model, io = random_draft(s, device, dtype), RandomTokenIO(s, device, dtype)
    backend = select_backend(device)
    max_text = 6 * s.text_tokens + s.graph_steps * (s.k + 1)
    make = lambda: make_drafter(s, model, io, backend, device, dtype, s.graph_requests, max_text)  # noqa: E731
    eager = make()
    paths = {}  # name -> (drafter, its GraphDrafting)
    for name, on in (("static", False), ("captured", True)):
        if on and not capture:
            continue
        drafter = make()
        paths[name] = (drafter, GraphDrafting(DecodeGraphs(drafter, s.k, list(s.graph_buckets), on), ChainDrafting()))
        paths[name][1].graphs.capture()  # a no-op without capture
    reqs = Requests(s, device, dtype, seed=11)
    decode_sizes, differs = set(), {name: [] for name in ("eager_vs_static", "eager_vs_captured",
                                                           "static_vs_captured")}
    for step in range(s.graph_steps):
        rids = _next_batch(s, reqs, step)
        batch = reqs.step(rids)
        if batch.decode_only:
            decode_sizes.add(len(rids))
        ids = {"eager": eager.step(batch, s.k).ids}
        for name, (drafter, drafting) in paths.items():
            ids[name] = drafter.step(batch, s.k, greedy, drafting).ids
        for pair in differs:
            a, b = pair.split("_vs_")
            if a in ids and b in ids and not torch.equal(ids[a], ids[b]):
                differs[pair].append(step)
        reqs.took(rids, ids["eager"])
        if step % 7 == 6:  # a request finishes; its slot goes to a newcomer later
            gone = rids[0]
            del reqs.live[gone]
            for d in [eager] + [d for d, _ in paths.values()]:
                d.release([gone])
    graphs = paths["static"][1].graphs
    exact = not differs["static_vs_captured"] and (dtype != torch.float32 or not (
        differs["eager_vs_static"] or differs["eager_vs_captured"]))
    return {"dtype": str(dtype).replace("torch.", ""), "steps": s.graph_steps, "captured": capture,
            "decode_batch_sizes": sorted(decode_sizes), "graph_steps": graphs.replays,
            "buckets_replayed": sorted({graphs.bucket(b) for b in decode_sizes if graphs.bucket(b)}),
            "steps_differing": differs, "passed": exact and graphs.replays > 0}


def _next_batch(s: CheckShapes, reqs: Requests, step: int) -> list[str]:
    """Every third step some prompts join (text ones and video ones, beside decodes); the others
    decode a random number of the live requests (so the batch size, and the bucket, changes)."""
    rnd = reqs.rnd
    decoding = [r for r, v in reqs.live.items() if v["seq"] > 0]
    room = s.graph_requests - len(reqs.live)
    if room > 0 and (step % 3 == 0 or not decoding):
        joined = []
        for i in range(rnd.randint(1, min(room, max(1, s.graph_requests // 4)))):
            text = rnd.randint(4, s.text_tokens)
            video = rnd.random() < 0.5
            rid = f"s{step}r{i}"
            reqs.join(rid, text + (rnd.randint(1, 4 * s.text_tokens) if video else 0), text)
            joined.append(rid)
        return joined + rnd.sample(decoding, rnd.randint(0, len(decoding)))
    return rnd.sample(decoding, rnd.randint(1, len(decoding)))


def run(s: CheckShapes, device: torch.device) -> dict:
    capture = device.type == "cuda"
    dtypes = list(dict.fromkeys([torch.float32, s.dtype]))
    runs = [lockstep(s, device, dt, capture) for dt in dtypes]
    return {"runs": runs, "passed": all(r["passed"] for r in runs)}
