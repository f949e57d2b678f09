"""The paged, windowed, incremental drafter computes exactly what a dense recomputation does.

Drives SparrowDrafter through chunked prefill (chunks that split visual runs), decode steps
with random acceptance (rejected rows present, as in vLLM's padded batches), and a restart
after preemption; at every step compares its draft logits with a from-scratch dense reference
over the text stream (visual positions removed, anchor + window mask).
"""

import random

import pytest
import torch

from vllm_sparrow.attention import TorchWindowAttention
from vllm_sparrow.config import SparrowConfig
from vllm_sparrow.drafter import SparrowDrafter, StepBatch
from vllm_sparrow.model import SparrowDraftModel
from vllm_sparrow.window import WindowSpec

H, V, VIS = 64, 50, 7  # hidden, vocab, visual placeholder id


class _IO:
    def __init__(self):
        g = torch.Generator().manual_seed(1)
        self.emb = torch.randn(V, H, generator=g)
        self.head = torch.randn(V, H, generator=g) / H**0.5

    def embed(self, ids):
        return self.emb[ids]

    def logits(self, h):
        return h @ self.head.T


def _model(anchors, window, block):
    cfg = SparrowConfig(hidden_size=H, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                        intermediate_size=96, vocab_size=V, anchor_tokens=anchors,
                        window_tokens=window, cache_block_size=block)
    torch.manual_seed(0)
    m = SparrowDraftModel(cfg)
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.2)
    return m.eval()


def _dense_logits(model, io, spec, stream, next_token, k):
    """stream: [(token, hidden)] of text positions so far; returns k logits rows."""
    hs = [h for _, h in stream]
    toks = [t for t, _ in stream[1:]] + [next_token]
    out = []
    for _ in range(k):
        n = len(hs)
        pos = torch.arange(n)

        def attend(q, kk, vv):
            g = q.shape[1] // kk.shape[1]
            mask = spec.mask(pos, pos)
            return torch.nn.functional.scaled_dot_product_attention(
                q.transpose(0, 1), kk.repeat_interleave(g, 1).transpose(0, 1),
                vv.repeat_interleave(g, 1).transpose(0, 1), attn_mask=mask).transpose(0, 1)

        y = model(torch.stack(hs), io.embed(torch.tensor(toks)), pos, attend)
        logits = io.logits(y[-1:])
        out.append(logits[0])
        hs.append(y[-1])
        toks.append(int(logits.argmax()))
    return torch.stack(out)


@pytest.mark.parametrize("anchors,window,block", [(2, 5, 4), (0, None, 3), (3, 1, 2)])
def test_incremental_drafts_equal_dense_recomputation(anchors, window, block):
    rnd = random.Random(anchors * 10 + block)
    model, io = _model(anchors, window, block), _IO()
    spec = WindowSpec(anchors, window)
    drafter = SparrowDrafter(model, io, (VIS,), TorchWindowAttention(), torch.device("cpu"), torch.float32)
    K = 3
    seen_logits = []

    def sampler(logits, rows):
        seen_logits.append(logits.clone())
        return logits.argmax(-1), None

    # a prompt with two visual runs; chunked prefill splits them
    prompt = [1, 2, 3] + [VIS] * 9 + [4, 5] + [VIS] * 6 + [6, 8, 9, 10]
    hidden = {i: torch.randn(H) for i in range(200)}
    seq: list[int] = []  # committed sequence tokens
    chunks = [5, 8, 4, len(prompt) - 17]
    stream = []  # reference text stream [(token, hidden)]
    for ci, c in enumerate(chunks):
        start = len(seq)
        toks = prompt[start : start + c]
        last = ci == len(chunks) - 1
        nxt = rnd.randrange(10, V) if last else prompt[start + c]
        batch = StepBatch(["r"], torch.tensor(toks), torch.stack([hidden[start + j] for j in range(c)]),
                          [0], [c], [start], [len(prompt)], torch.tensor([nxt]), [not last])
        seen_logits.clear()
        ids, _ = drafter.step(batch, K, sampler)
        seq += toks
        stream += [(t, hidden[start + j]) for j, t in enumerate(toks) if t != VIS]
        if last:
            ref = _dense_logits(model, io, spec, stream, nxt, K)
            assert torch.allclose(torch.cat(seen_logits), ref, atol=1e-4)
    # decode: rows = [next, d1..dK]; a random number of them accepted
    for step in range(12):
        rows = [nxt] + ids[0].tolist()
        a = rnd.randrange(0, K + 1)
        start = len(seq)
        for j in range(K + 1):
            hidden[start + j] = torch.randn(H)
        nxt2 = rnd.randrange(10, V)
        batch = StepBatch(["r"], torch.tensor(rows), torch.stack([hidden[start + j] for j in range(K + 1)]),
                          [0], [a + 1], [start], [len(prompt)], torch.tensor([nxt2]), [False])
        seen_logits.clear()
        ids, _ = drafter.step(batch, K, sampler)
        seq += rows[: a + 1]
        stream += [(t, hidden[start + j]) for j, t in enumerate(rows[: a + 1])]
        nxt = nxt2
        ref = _dense_logits(model, io, spec, stream, nxt, K)
        assert torch.allclose(torch.cat(seen_logits), ref, atol=1e-4), f"step {step}"
        if window is not None:  # memory stays bounded by anchors + window, not by length
            bound = -(-anchors // block) + -(-(window + K) // block) + 2
            assert drafter.cache.blocks_in_use("r") <= bound
    text_len = len(stream)
    # preemption: the request restarts from sequence index 0 and rebuilds its stream
    drafter.release(["r"])
    assert drafter.cache.blocks_in_use() == 0
    toks = seq
    batch = StepBatch(["r"], torch.tensor(toks), torch.stack([hidden[j] for j in range(len(toks))]),
                      [0], [len(toks)], [0], [len(prompt)], torch.tensor([nxt]), [False])
    seen_logits.clear()
    drafter.step(batch, K, sampler)
    assert drafter.states["r"].committed == text_len
    assert torch.allclose(torch.cat(seen_logits), _dense_logits(model, io, spec, stream, nxt, K), atol=1e-4)


def test_visual_positions_never_enter_the_cache():
    model, io = _model(2, 4, 4), _IO()
    drafter = SparrowDrafter(model, io, (VIS,), TorchWindowAttention(), torch.device("cpu"), torch.float32)
    usage = []
    for n_vis in (4, 400):
        prompt = [1, 2, 3] + [VIS] * n_vis + [4, 5, 6]
        batch = StepBatch([f"v{n_vis}"], torch.tensor(prompt), torch.randn(len(prompt), H), [0],
                          [len(prompt)], [0], [len(prompt)], torch.tensor([11]), [False])
        drafter.step(batch, 3, lambda lg, r: (lg.argmax(-1), None))
        usage.append((drafter.states[f"v{n_vis}"].committed, drafter.cache.bytes_in_use(f"v{n_vis}")))
    assert usage[0] == usage[1] and usage[0][0] == 6
