"""Drafts stay right once a request's stream crosses positions 32,768 and 65,536.

Users of vLLM's drafters report acceptance dying engine-wide once a sequence crosses position
32,768 (vLLM issue 52873: a drafter's positions and attention metadata overflowing). Sparrow's
drafter owns both: a request's sequence positions (visual placeholders included) and its text
indices (what the draft's RoPE and window use). Here, through chunked prefill and decode steps
with random acceptance: a video request whose sequence crosses 65,536 positions while its text
stream stays short, and two long text requests whose text indices cross 32,768 and 65,536 while
they decode. Every drafting step's logits equal a dense reference computed by the training model.

The reference: the draft is one layer, so the chain after entry n reads the anchors [0, A) and the
last W entries, each made from its own inputs at its own text index. The training model runs over
exactly those entries, at their true text indices, under the window rule written by position (the
full n x n reference of tests/support/dense_reference.py is 65k x 65k here). The GPU check runs the same
crossing at 7B shapes (vllm_sparrow/gpu_check/, its `long_positions` part).
"""

import random

import pytest
import torch

from vllm_sparrow.attention import TorchWindowAttention
from vllm_sparrow.drafter import SparrowDrafter, StepBatch
from vllm_sparrow.drafting.chain import CHAIN
from support.tiny_drafts import IO, tiny_draft

H, V, VIS, K, A, W = 64, 50, 7, 3, 4, 16
CHUNK = 8192  # prefill rows per step


@torch.no_grad()
def windowed_reference(model, io, hidden: torch.Tensor, following: list[int], drafts: list[int]) -> torch.Tensor:
    """Draft logits [len(drafts), V] after a stream of n entries (hidden [n, H], the text token
    after each), from the anchors and the last W entries only, at their true text indices."""
    n = hidden.shape[0]
    keep = sorted(set(range(min(A, n))) | set(range(max(0, n - W), n)))
    hs, toks, pos, out = [hidden[i].float() for i in keep], [following[i] for i in keep], list(keep), []
    for s, d in enumerate(drafts):
        p = torch.tensor(pos)
        visible = (p[None, :] <= p[:, None]) & ((p[None, :] < A) | (p[:, None] - p[None, :] < W))  # [q, k]

        def attend(q, k, v, mask=visible):  # [N, heads, D], [N, kv_heads, D] x 2
            group = q.shape[1] // k.shape[1]
            o = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(0, 1), k.repeat_interleave(group, 1).transpose(0, 1),
                v.repeat_interleave(group, 1).transpose(0, 1), attn_mask=mask)
            return o.transpose(0, 1)

        y = model(torch.stack(hs), io.embed(torch.tensor(toks)), p, attend)
        out.append(io.logits(y[-1:])[0])
        hs.append(y[-1])
        toks.append(d)
        pos.append(pos[-1] + 1)
    return torch.stack(out)


class _Stream:
    """A request: its prompt, the states the target computed at each position, what was accepted."""

    def __init__(self, rid, prompt: list[int], rnd: random.Random):
        self.rid, self.prompt, self.rnd = rid, prompt, rnd
        self.seq: list[int] = []  # tokens whose states the drafter received
        self.states = torch.randn(len(prompt) + 400, H, generator=torch.Generator().manual_seed(len(prompt)))
        self.text: list[int] = []  # sequence positions of text entries, in order
        self.next, self.drafts = None, []

    def rows(self):
        start = len(self.seq)
        if start < len(self.prompt):
            toks = self.prompt[start : start + CHUNK]
            return toks, len(toks), start + len(toks) < len(self.prompt)
        toks = [self.next] + self.drafts
        return toks, 1 + self.rnd.randrange(0, len(toks)), False

    def advance(self, toks, valid, mid):
        start = len(self.seq)
        self.text += [start + j for j in range(valid) if not (toks[j] == VIS and start + j < len(self.prompt))]
        self.seq += toks[:valid]
        self.next = None if mid else self.rnd.randrange(10, V)

    def reference(self, model, io, drafts):
        following = [self.seq[i] for i in self.text[1:]] + [self.next]
        return windowed_reference(model, io, self.states[self.text], following, drafts)


def test_drafts_past_positions_32768_and_65536_equal_the_dense_reference():
    rnd = random.Random(3)
    model, io = tiny_draft(A, W, V), IO(V, seed=1)
    drafter = SparrowDrafter(model, io, (VIS,), TorchWindowAttention(), torch.device("cpu"), torch.float32,
                             max_requests=3, max_draft_tokens=K, max_text_tokens=70_000)
    text = lambda n: [rnd.randrange(10, V) for _ in range(n)]  # noqa: E731
    reqs = [_Stream("video", text(8) + [VIS] * 66_000 + text(6), rnd),  # sequence past 65,536, text short
            _Stream("text32k", text(32_760), rnd), _Stream("text64k", text(65_530), rnd)]
    checked = {r.rid: [] for r in reqs}
    while len(reqs[0].seq) < len(reqs[0].prompt) + 12 or len(reqs[2].text) < 65_545:
        parts = [(r, *r.rows()) for r in reqs]
        toks, row_start, valid, seq_start, prompt, nxt, mids = [], [], [], [], [], [], []
        for r, t, n_valid, mid in parts:
            row_start.append(len(toks))
            seq_start.append(len(r.seq))
            toks += t
            valid.append(n_valid)
            prompt.append(len(r.prompt))
            mids.append(mid)
        hidden = torch.cat([r.states[s : s + len(t)] for (r, t, _, _), s in zip(parts, seq_start)])
        for r, t, n_valid, mid in parts:
            r.advance(t, n_valid, mid)
            nxt.append(r.next if r.next is not None else 0)
        seen = []

        def sampler(logits, position=0):
            seen.append(logits.clone())
            return logits.argmax(-1), None

        batch = StepBatch.from_lists([r.rid for r in reqs], torch.tensor(toks), hidden, row_start, valid, seq_start,
                                     prompt, torch.tensor(nxt), mids, visual_token_ids=(VIS,))
        ids = CHAIN.step(drafter, batch, K, sampler).ids
        for b, r in enumerate(reqs):
            if mids[b]:
                continue
            got = torch.stack([s[b] for s in seen])
            ref = r.reference(model, io, ids[b].tolist())
            assert torch.allclose(got, ref, atol=1e-4), (
                f"{r.rid} at sequence position {len(r.seq)}, text index {len(r.text)}: "
                f"{(got - ref).abs().max():.2e} from the reference")
            checked[r.rid].append((len(r.seq), len(r.text)))
            r.drafts = ids[b].tolist()
    seq = {rid: [s for s, _ in c] for rid, c in checked.items()}
    idx = {rid: [t for _, t in c] for rid, c in checked.items()}
    assert min(seq["video"]) > 65_536 and max(idx["video"]) < 100  # positions past 65,536, a short text stream
    assert min(idx["text32k"]) < 32_768 < max(idx["text32k"]), idx["text32k"]  # crossed while drafting
    assert min(idx["text64k"]) < 65_536 < max(idx["text64k"]), idx["text64k"]
