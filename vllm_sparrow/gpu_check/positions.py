"""Part 6: drafts past positions 32,768 and 65,536 at the check's shapes, against a reference.

vLLM users report drafters whose acceptance dies engine-wide once a sequence crosses position
32,768 (vLLM issue 52873). Sparrow's drafter owns its positions (sequence positions, visual
placeholders included, and the text indices its RoPE and window use) and its attention
metadata. Three requests go through chunked prefill and decode steps with random acceptance: a
video whose sequence crosses 65,536 positions while its text stream stays short, and two text
requests whose text indices cross 32,768 and 65,536 while they decode. Each drafting step's
logits are compared with the training model run over the entries the chain reads (the draft is
one layer: the anchors and the last W entries, each at its true text index, under the window
rule written by position), in float32: logits within 1e-3 of the reference's scale, and the
drafts their argmax. tests/test_drafts_past_32768_positions_match_the_dense_reference.py runs the same
crossing on CPU with its own reference.
"""

from __future__ import annotations

import random

import torch

from ..attention import select_backend
from ..drafting.step import StepBatch
from ..model import SparrowDraftModel
from .shapes import CheckShapes
from .workload import RandomTokenIO, make_drafter, random_draft, visual_token
from ..drafting.chain import CHAIN

CHUNK = 8192  # prefill rows per step
PROMPTS = {"video": (8, 66_000, 6), "text32k": (32_760, 0, 0), "text64k": (65_530, 0, 0)}  # text, visual, text


@torch.no_grad()
def windowed_reference(model: SparrowDraftModel, io, hidden: torch.Tensor, following: list[int],
                       drafts: list[int]) -> torch.Tensor:
    """Draft logits [len(drafts), vocab] after n entries (hidden [n, H], the text token after
    each) from the anchors and the last W entries, at their true text indices."""
    cfg, n, dev = model.cfg, hidden.shape[0], hidden.device
    A, W = cfg.anchor_tokens, cfg.window_tokens or n
    keep = sorted(set(range(min(A, n))) | set(range(max(0, n - W), n)))
    hs, toks, pos, out = list(hidden[keep].float()), [following[i] for i in keep], list(keep), []
    for d in drafts:
        p = torch.tensor(pos, device=dev)
        visible = (p[None, :] <= p[:, None]) & ((p[None, :] < A) | (p[:, None] - p[None, :] < W))  # [q, k]

        def attend(q, k, v, mask=visible):  # [N, heads, D], [N, kv_heads, D] x 2
            group = q.shape[1] // k.shape[1]
            o = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(0, 1), k.repeat_interleave(group, 1).transpose(0, 1),
                v.repeat_interleave(group, 1).transpose(0, 1), attn_mask=mask)
            return o.transpose(0, 1)

        y = model(torch.stack(hs), io.embed(torch.tensor(toks, device=dev)), p, attend)
        out.append(io.logits(y[-1:])[0].float())
        hs.append(y[-1])
        toks.append(d)
        pos.append(pos[-1] + 1)
    return torch.stack(out)


def run(s: CheckShapes, device: torch.device) -> dict:
    dtype, rnd = torch.float32, random.Random(5)
    model, io = random_draft(s, device, dtype), RandomTokenIO(s, device, dtype)
    drafter = make_drafter(s, model, io, select_backend(device), device, dtype, len(PROMPTS), 70_000)
    vis, g = visual_token(s), torch.Generator(device=device).manual_seed(3)
    words = lambda n: [rnd.randrange(vis) for _ in range(n)]  # noqa: E731
    reqs = {rid: dict(prompt=words(a) + [vis] * b + words(c), seq=[], text=[], next=None, drafts=[],
                      states=torch.randn(a + b + c + 400, s.hidden, generator=g, device=device))
            for rid, (a, b, c) in PROMPTS.items()}
    checked = {rid: [] for rid in reqs}
    worst, argmax_equal = 0.0, True
    while len(reqs["video"]["seq"]) < sum(PROMPTS["video"]) + 12 or len(reqs["text64k"]["text"]) < 65_545:
        rows, valid, seq0, mids = [], [], [], []
        for r in reqs.values():
            start = len(r["seq"])
            if start < len(r["prompt"]):
                t = r["prompt"][start : start + CHUNK]
                nv, mid = len(t), start + len(t) < len(r["prompt"])
            else:
                t = [r["next"]] + r["drafts"]
                nv, mid = 1 + rnd.randrange(len(t)), False
            rows.append(t), valid.append(nv), seq0.append(start), mids.append(mid)
            r["text"] += [start + j for j in range(nv) if not (t[j] == vis and start + j < len(r["prompt"]))]
            r["seq"] += t[:nv]
            r["next"] = None if mid else rnd.randrange(vis)
        starts = [sum(len(t) for t in rows[:i]) for i in range(len(rows))]
        hidden = torch.cat([r["states"][s0 : s0 + len(t)] for r, s0, t in zip(reqs.values(), seq0, rows)])
        batch = StepBatch.from_lists(list(reqs), torch.tensor(sum(rows, []), device=device), hidden, starts, valid,
                                     seq0, [len(r["prompt"]) for r in reqs.values()],
                                     torch.tensor([r["next"] or 0 for r in reqs.values()], device=device), mids,
                                     visual_token_ids=(vis,))
        seen = []

        def sampler(logits, position=0):
            seen.append(logits.float().clone())
            return logits.argmax(-1), None

        ids = CHAIN.step(drafter, batch, s.k, sampler).ids.tolist()
        for b, (rid, r) in enumerate(reqs.items()):
            if mids[b]:
                continue
            got = torch.stack([x[b] for x in seen])
            following = [r["seq"][i] for i in r["text"][1:]] + [r["next"]]
            ref = windowed_reference(model, io, r["states"][r["text"]], following, ids[b])
            worst = max(worst, float((got - ref).abs().max() / ref.abs().max().clamp(min=1e-6)))
            argmax_equal &= got.argmax(-1).tolist() == ids[b]  # the drafts are the logits' argmax
            checked[rid].append((len(r["seq"]), len(r["text"])))
            r["drafts"] = ids[b]
    crossed = {"video_sequence_past_65536": min(sq for sq, _ in checked["video"]) > 65_536,
               "text_index_crossed_32768": min(t for _, t in checked["text32k"]) < 32_768 < max(t for _, t in checked["text32k"]),
               "text_index_crossed_65536": min(t for _, t in checked["text64k"]) < 65_536 < max(t for _, t in checked["text64k"])}
    return {"steps_checked": {rid: len(c) for rid, c in checked.items()}, "crossed": crossed,
            "worst_relative_logit_error": worst, "argmax_equal": argmax_equal,
            "passed": all(crossed.values()) and argmax_equal and worst <= 1e-3}
