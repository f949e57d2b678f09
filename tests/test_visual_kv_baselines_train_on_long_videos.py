"""The visual-KV baselines (EAGLE-style, EAGLE-3) train on every position of a long video: the
training objective attends only from the entries whose outputs count (the response, and
mtp_steps entries before it), which changes no loss, gradient or replayed proposal, and keeps
a 25,000-position stream's step in a few GB instead of the dense masks' tens."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from vllm_sparrow.training.eagle_baseline import EagleBaselineConfig, EagleBaselineDraft
from vllm_sparrow.training.objective import unrolled_stages

H, VOCAB = 64, 50


class TableIO:
    def __init__(self, hidden=H, dtype=torch.float32):
        g = torch.Generator().manual_seed(1)
        self.emb = torch.randn(VOCAB, hidden, generator=g, dtype=dtype)
        self.head = torch.randn(VOCAB, hidden, generator=g, dtype=dtype)

    def embed(self, ids):
        return self.emb[ids]

    def logits(self, hidden):
        return hidden @ self.head.T


def _eagle(hidden=H, seed=0):
    cfg = EagleBaselineConfig(hidden_size=hidden, num_attention_heads=4, num_key_value_heads=2,
                              head_dim=hidden // 4, intermediate_size=2 * hidden, vocab_size=VOCAB)
    torch.manual_seed(seed)
    model = EagleBaselineDraft(cfg)
    for p in model.parameters():
        if p.ndim == 2:
            torch.nn.init.normal_(p, std=0.2)
    return model


def _stream(m, prompt_len, seed=2):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (m,), generator=g)  # [m]
    hidden = torch.randn(m, H, generator=g, dtype=torch.float64)  # [m, H] (float64: equal, not close)
    positions = torch.arange(m) * 3  # [m] rotary positions that are not the index
    scored = torch.arange(m - 2) >= prompt_len - 1  # [m - 2] the response's entries
    return tokens, hidden, positions, scored


@pytest.mark.parametrize("mtp_steps", [0, 2, 4])
def test_loss_and_gradients_equal_attending_from_every_entry(mtp_steps):
    tokens, hidden, positions, scored = _stream(120, prompt_len=90)
    io = TableIO(dtype=torch.float64)
    results = {}
    for first in (None, 0):  # None: from the first scored entry (the default); 0: every entry
        draft = _eagle().double()
        stages = unrolled_stages(draft, io, tokens, hidden, scored, mtp_steps, 0.1,
                                 rope_positions=positions, first_entry=first)
        loss = sum(0.5 ** s * r.loss for s, r in enumerate(stages))
        loss.backward()
        results[first] = (loss.item(), [r.correct for r in stages],
                          {n: p.grad.clone() for n, p in draft.named_parameters()})
    (loss_a, correct_a, grads_a), (loss_b, correct_b, grads_b) = results[None], results[0]
    assert loss_a == pytest.approx(loss_b, rel=1e-12)
    assert correct_a == correct_b
    for name in grads_b:
        torch.testing.assert_close(grads_a[name], grads_b[name], atol=1e-10, rtol=1e-10)


def test_replayed_proposals_equal_from_the_first_proposal_on():
    tokens, hidden, positions, _ = _stream(100, prompt_len=70)
    none = torch.zeros(98, dtype=torch.bool)
    draft, io = _eagle().double().eval(), TableIO(dtype=torch.float64)
    with torch.no_grad():
        every = unrolled_stages(draft, io, tokens, hidden, none, 4, 0.0, return_outputs=True,
                                rope_positions=positions)
        tail = unrolled_stages(draft, io, tokens, hidden, none, 4, 0.0, return_outputs=True,
                               rope_positions=positions, first_entry=69)
    for a, b in zip(every, tail):
        torch.testing.assert_close(a.outputs[69:], b.outputs[69:], atol=1e-10, rtol=1e-10)


def test_scored_entries_before_the_first_entry_are_refused():
    tokens, hidden, positions, scored = _stream(40, prompt_len=10)
    with pytest.raises(ValueError, match="first_entry"):
        unrolled_stages(_eagle(), TableIO(), tokens, hidden, scored, 1, 0.1, rope_positions=positions,
                        first_entry=20)


LONG_STEP = textwrap.dedent("""
    import json, sys, time, torch
    sys.path.insert(0, sys.argv[1])
    from test_visual_kv_baselines_train_on_long_videos import TableIO, _eagle
    from vllm_sparrow.training.objective import unrolled_stages

    def peak_rss_kib():
        # this process's own peak (VmHWM starts afresh at exec); getrusage's ru_maxrss keeps the
        # parent's peak across fork and exec, the whole pytest process's late in the suite
        return next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM:"))

    n, prompt_len, hidden = 25_000, 24_700, 128  # a 1,560 s clip at 16 visual tokens a second
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 50, (n,), generator=g)
    states = torch.randn(n, hidden, generator=g)
    scored = torch.arange(n - 2) >= prompt_len - 1
    draft, t = _eagle(hidden), time.perf_counter()
    stages = unrolled_stages(draft, TableIO(hidden), tokens, states, scored, 2, 0.1,
                             rope_positions=torch.arange(n))
    sum(r.loss for r in stages).backward()
    print(json.dumps({"seconds": time.perf_counter() - t, "scored": stages[0].scored,
                      "max_rss_gb": peak_rss_kib() / 2**20}))
""")


def test_a_25k_position_stream_trains_in_bounded_memory():
    """Dense [n, n] masks for 3 MTP blocks and their float32 attention weights would need
    about 31 GB here; the step must fit in 4 GB (torch itself takes about 0.5)."""
    run = subprocess.run([sys.executable, "-c", LONG_STEP, str(Path(__file__).parent)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["scored"] == 25_000 - 2 - (24_700 - 1)
    assert out["max_rss_gb"] < 4.0, out
