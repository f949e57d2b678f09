"""The batched, ring-cached, incremental drafter computes exactly what a dense recomputation does.

Drives SparrowDrafter through chunked prefill (chunks that split visual runs), decode steps
with random acceptance (rejected rows present, as in vLLM's padded batches), restarts after
preemption, and batches that mix requests in every phase; at every step compares each drafting
request's draft logits with a from-scratch dense reference over its text stream (visual
positions removed, the window rule written out in tests/support/dense_reference.py) computed by the
training model, and checks that the ring holds the keys and values of exactly the entries a
later query can read (the anchors and the last W), as the training model computes them.
"""

import random

import pytest
import torch

from vllm_sparrow.attention import TorchWindowAttention
from vllm_sparrow.drafter import SparrowDrafter, StepBatch
from vllm_sparrow.drafting.chain import CHAIN
from support.tiny_drafts import IO, tiny_draft
from support.dense_reference import dense_draft_logits

H, V, VIS, K = 64, 50, 7, 3  # hidden, vocab, visual placeholder id, draft depth


def _dense_logits(model, io, stream, next_token, drafts):
    """stream: [(token, hidden)] of text positions so far; the chain's logits, teacher-forced by
    the drafter's own drafts."""
    hidden = torch.stack([h for _, h in stream])
    return dense_draft_logits(model, io, hidden, [t for t, _ in stream[1:]] + [next_token], drafts)


def _check_ring_holds_what_later_queries_read(drafter, model, io, rid, stream, next_token):
    """The slot's rows hold the K/V of entries [0, A) and [c - W, c) (c committed entries): what any
    query at index >= c reads. Reference K/V: the training model's, from each entry's inputs."""
    cfg, cache = model.cfg, drafter.cache
    toks = [t for t, _ in stream[1:]] + [next_token]
    c = len(stream)
    live = list(range(min(cfg.anchor_tokens, c)))
    live += range(max(cfg.anchor_tokens, c - (cfg.window_tokens or c)), c)
    with torch.no_grad():
        x = model.fc(torch.cat([model.embed_norm(io.embed(torch.tensor(toks))),
                                model.hidden_norm(torch.stack([h for _, h in stream]))], -1))  # [c, H]
        k_ref, v_ref = model.key_values(x, torch.arange(c))  # [c, kv_heads, D]
    slot, A, R = drafter.slot_of[rid], cfg.anchor_tokens, cache.ring
    for i in live:
        row = i if i < A else A + (i - A) % R
        assert torch.allclose(cache.k[slot, :, row], k_ref[i], atol=1e-4), f"request {rid}: key of entry {i}"
        assert torch.allclose(cache.v[slot, :, row], v_ref[i], atol=1e-4), f"request {rid}: value of entry {i}"


class _Request:
    """One simulated request: a prompt with visual runs, then decode steps with random acceptance."""

    def __init__(self, rid, prompt, rnd):
        self.rid, self.prompt, self.rnd = rid, prompt, rnd
        self.seq: list[int] = []  # tokens whose states the drafter has received (valid rows)
        self.hidden: dict[int, torch.Tensor] = {}
        self.stream = []  # reference text stream [(token, hidden)]
        self.next = None  # token after the last valid row, once the prompt is done
        self.drafts = None

    def rows(self, chunk):
        """(tokens, hidden, num_valid, mid_prefill) of this step."""
        start = len(self.seq)
        if start < len(self.prompt):
            toks = self.prompt[start : start + chunk]
            n_valid, mid = len(toks), start + len(toks) < len(self.prompt)
        else:
            toks = [self.next] + (self.drafts or [])
            n_valid, mid = 1 + self.rnd.randrange(0, len(toks)), False
        hid = [self.hidden.setdefault(start + j, torch.randn(H)) for j in range(len(toks))]
        return toks, hid, n_valid, mid

    def advance(self, toks, hid, n_valid, mid, prompt_len):
        start = len(self.seq)
        for j in range(n_valid):
            if not (toks[j] == VIS and start + j < prompt_len):
                self.stream.append((toks[j], hid[j]))
        self.seq += toks[:n_valid]
        if mid:
            self.next = None
        else:
            self.next = self.rnd.randrange(10, V)


def _count_paths(drafter):
    """Count the steps that took the fixed-shape decode path and the packed one."""
    counts = {"decode": 0, "general": 0}
    for name, attr in (("decode", "_commit_decode"), ("general", "_commit_packed")):
        inner = getattr(drafter, attr)

        def counted(*a, _inner=inner, _name=name, **kw):
            counts[_name] += 1
            return _inner(*a, **kw)

        setattr(drafter, attr, counted)
    return counts


def _run_steps(drafter, model, io, reqs, steps, rnd, chunk_choices):
    active = list(reqs)
    for _ in range(steps):
        batch_reqs = rnd.sample(active, rnd.randrange(1, len(active) + 1))
        parts = [(r, *r.rows(rnd.choice(chunk_choices))) for r in batch_reqs]
        toks, hid, row_start, valid, seq_start, prompt_lens, nxt, mids = [], [], [], [], [], [], [], []
        for r, t, h, n_valid, mid in parts:
            row_start.append(len(toks))
            toks += t
            hid += h
            valid.append(n_valid)
            seq_start.append(len(r.seq))
            prompt_lens.append(len(r.prompt))
            mids.append(mid)
            r.advance(t, h, n_valid, mid, len(r.prompt))
            nxt.append(r.next if r.next is not None else 0)
        seen = []

        def sampler(logits, position=0):
            seen.append(logits.clone())
            return logits.argmax(-1), None

        # Half the steps bound the packed layout by the text rows the host counts (tight), half
        # by every row (placeholders become padding rows).
        batch = StepBatch.from_lists([r.rid for r, *_ in parts], torch.tensor(toks), torch.stack(hid),
                                     row_start, valid, seq_start, prompt_lens, torch.tensor(nxt), mids,
                                     visual_token_ids=(VIS,) if rnd.random() < 0.5 else None)
        ids = CHAIN.step(drafter, batch, K, sampler).ids
        for b, (r, *_rest) in enumerate(parts):
            if mids[b]:
                assert ids[b].eq(0).all()
                continue
            got = torch.stack([s[b] for s in seen])
            ref = _dense_logits(model, io, r.stream, r.next, ids[b].tolist())
            assert torch.allclose(got, ref, atol=1e-4), f"request {r.rid}"
            _check_ring_holds_what_later_queries_read(drafter, model, io, r.rid, r.stream, r.next)
            r.drafts = ids[b].tolist()


def _prompt(rnd, n_vis):
    return [1, 2, 3] + [VIS] * n_vis + [4, 5] + [VIS] * (n_vis // 2) + [rnd.randrange(10, V) for _ in range(4)]


@pytest.mark.parametrize("anchors,window", [(2, 5), (0, None), (3, 1), (0, 2)])
def test_incremental_drafts_equal_dense_recomputation(anchors, window):
    rnd = random.Random(anchors * 10 + (window or 0))
    model, io = tiny_draft(anchors, window, V), IO(V, seed=1)
    drafter = SparrowDrafter(model, io, (VIS,), TorchWindowAttention(), torch.device("cpu"), torch.float32,
                             max_requests=2, max_draft_tokens=K, max_text_tokens=256)
    paths = _count_paths(drafter)
    req = _Request("r", _prompt(rnd, 9), rnd)
    _run_steps(drafter, model, io, [req], 18, rnd, [4, 5, 8])
    assert paths["decode"] >= 5 and paths["general"] >= 2, paths
    text_len = len(req.stream)
    assert drafter.stats()["text_entries"]["r"] == text_len  # each state paired with its next token
    # preemption: the request restarts from sequence index 0 and rebuilds its stream
    drafter.release(["r"])
    assert drafter.stats()["slots_in_use"] == 0
    again = _Request("r", req.seq, rnd)
    again.hidden = req.hidden
    _run_steps(drafter, model, io, [again], 3, rnd, [len(req.seq)])
    assert len(again.stream) >= text_len


@pytest.mark.parametrize("anchors,window", [(2, 5), (0, None)])
def test_batches_mixing_prefill_decode_and_restarts_equal_dense_recomputation(anchors, window):
    rnd = random.Random(7)
    model, io = tiny_draft(anchors, window, V), IO(V, seed=1)
    drafter = SparrowDrafter(model, io, (VIS,), TorchWindowAttention(), torch.device("cpu"), torch.float32,
                             max_requests=6, max_draft_tokens=K, max_text_tokens=512)
    paths = _count_paths(drafter)
    nbytes = drafter.cache.nbytes
    reqs = [_Request(f"r{i}", _prompt(rnd, rnd.randrange(0, 30)), rnd) for i in range(6)]
    _run_steps(drafter, model, io, reqs, 30, rnd, [1, 3, 4, 16])
    # a request that left (finished or preempted) frees its slot for a new one
    drafter.release(["r0", "r3"])
    newcomers = [_Request(f"n{i}", _prompt(rnd, 12), rnd) for i in range(2)]
    _run_steps(drafter, model, io, [r for r in reqs if r.rid not in ("r0", "r3")] + newcomers, 20, rnd,
               [2, 4, 40])
    assert drafter.cache.nbytes == nbytes  # allocated once, never grown
    assert paths["decode"] >= 5 and paths["general"] >= 5, paths  # both commit paths were checked
    with pytest.raises(RuntimeError, match="max_num_seqs"):
        drafter._slot("one-too-many")


def test_visual_positions_never_enter_the_cache():
    model, io = tiny_draft(2, 4, V), IO(V, seed=1)
    drafter = SparrowDrafter(model, io, (VIS,), TorchWindowAttention(), torch.device("cpu"), torch.float32)
    for n_vis in (4, 400):
        prompt = [1, 2, 3] + [VIS] * n_vis + [4, 5, 6]
        batch = StepBatch.from_lists([f"v{n_vis}"], torch.tensor(prompt), torch.randn(len(prompt), H), [0],
                                     [len(prompt)], [0], [len(prompt)], torch.tensor([11]), [False])
        CHAIN.step(drafter, batch, 3)
    entries = drafter.stats()["text_entries"]
    assert entries["v4"] == entries["v400"] == 6


@pytest.mark.parametrize("resume", ["whole-sequence-prefill", "last-token-decode"])
def test_a_tracked_request_whose_stream_start_moved_restarts_like_a_new_one(resume):
    """vLLM 0.34 does not tell the speculator of preemption, so a preempted request comes back
    to the drafter still holding its slot: its next step starts at another sequence index than
    the one its slot has seen. The drafter then restarts the request's text stream at index 0
    (what it drafts equals a dense recomputation over what it received since). Resumed from
    scratch, the whole sequence arrives as a prompt (the packed commit); resumed from the prefix
    cache, only its last token arrives, a decode row (the fixed-layout commit)."""
    rnd = random.Random(11)
    model, io = tiny_draft(2, 5, V), IO(V, seed=1)
    drafter = SparrowDrafter(model, io, (VIS,), TorchWindowAttention(), torch.device("cpu"), torch.float32,
                             max_requests=3, max_draft_tokens=K, max_text_tokens=256)
    reqs = [_Request(f"r{i}", _prompt(rnd, 6 + 3 * i), rnd) for i in range(3)]
    _run_steps(drafter, model, io, reqs, 24, rnd, [4, 8])
    old = reqs[0]
    assert len(old.seq) > len(old.prompt) + 2, "the request decoded before it was preempted"
    slot = drafter.slot_of[old.rid]
    again = _Request(old.rid, old.seq if resume == "whole-sequence-prefill" else old.prompt, rnd)
    again.hidden = old.hidden  # the target recomputes the same states
    if resume == "last-token-decode":  # everything before the last token is a prefix-cache hit
        again.seq, again.next = old.seq[:-1], old.seq[-1]
    paths = _count_paths(drafter)
    # no release: the slot still holds the old stream, which the restart must not extend
    _run_steps(drafter, model, io, [again], 1, rnd, [len(old.seq)])
    assert paths["general" if resume == "whole-sequence-prefill" else "decode"] == 1, paths
    _run_steps(drafter, model, io, [again] + reqs[1:], 6, rnd, [2, len(old.seq)])
    assert drafter.slot_of[old.rid] == slot
    assert drafter.stats()["text_entries"][old.rid] == len(again.stream)
