"""MTP training replays inference exactly: the stage-s prediction at position t equals the s-th
chained draft the serve-time drafter makes after committing positions <= t-s (when its earlier
drafts were the true tokens), under the anchor + window rule; IVSB visual keys are causal and
absent with visual fraction 0."""

import pytest
import torch

from vllm_sparrow.attention import TorchWindowAttention
from vllm_sparrow.config import SparrowConfig
from vllm_sparrow.drafter import SparrowDrafter, StepBatch
from vllm_sparrow.drafting.chain import CHAIN
from vllm_sparrow.model import SparrowDraftModel
from vllm_sparrow.training.ivsb import VisualBridge, pick_visual, visual_keys, visual_text_positions
from vllm_sparrow.training.objective import unrolled_stages

H, VOCAB = 64, 50


class TableIO:
    def __init__(self):
        g = torch.Generator().manual_seed(1)
        self.emb = torch.randn(VOCAB, H, generator=g)
        self.head = torch.randn(VOCAB, H, generator=g)

    def embed(self, ids):
        return self.emb[ids]

    def logits(self, hidden):
        return hidden @ self.head.T


def _draft(window):
    cfg = SparrowConfig(hidden_size=H, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                        intermediate_size=96, vocab_size=VOCAB, anchor_tokens=2, window_tokens=window,
                        )
    torch.manual_seed(0)
    model = SparrowDraftModel(cfg)
    for p in model.parameters():
        if p.ndim == 2:
            torch.nn.init.normal_(p, std=0.2)
    return model.eval()


def _serve_chain(draft, io, tokens, hidden, c, depth):
    """Logits of the chain's drafts 1..depth after committing 0..c, teacher-forcing the drafts."""
    drafter = SparrowDrafter(draft, io, (), TorchWindowAttention(), torch.device("cpu"), torch.float32)
    seen = []

    def sample(logits, position=0):
        seen.append(logits[0].clone())
        return tokens[c + 1 + len(seen) : c + 2 + len(seen)], None  # the true next token

    batch = StepBatch.from_lists(["r"], tokens[: c + 1], hidden[: c + 1], [0], [c + 1], [0], [c + 1],
                      tokens[c + 1 : c + 2], [False])
    CHAIN.step(drafter, batch, depth, sample)
    return seen


@pytest.mark.parametrize("window", [None, 5])
def test_stage_s_equals_the_s_th_chained_draft_at_serve_time(window):
    draft, io = _draft(window), TableIO()
    g = torch.Generator().manual_seed(2)
    m = 16
    tokens = torch.randint(0, VOCAB, (m,), generator=g)
    hidden = torch.randn(m, H, generator=g)
    scored = torch.ones(m - 2, dtype=torch.bool)
    with torch.no_grad():
        stages = unrolled_stages(draft, io, tokens, hidden, scored, 2, 0.1, return_outputs=True)
    for c in (3, 8, 11):
        chain = _serve_chain(draft, io, tokens, hidden, c, 3)
        for s in range(3):  # draft s+1 of the chain is stage s at entry c+s
            torch.testing.assert_close(io.logits(stages[s].outputs[c + s]), chain[s], atol=1e-4, rtol=1e-4)


def test_visual_keys_are_causal_and_absent_at_fraction_zero():
    draft, io = _draft(None), TableIO()
    g = torch.Generator().manual_seed(3)
    is_visual = torch.tensor([False] * 3 + [True] * 6 + [False] * 9)  # video after 3 text tokens
    m = int((~is_visual).sum())
    tokens, hidden = torch.randint(0, VOCAB, (m,), generator=g), torch.randn(m, H, generator=g)
    bridge = VisualBridge(H, H)
    vpos = visual_text_positions(is_visual)
    assert vpos.tolist() == [3] * 6
    vk, vv = visual_keys(draft, bridge, torch.randn(6, H, generator=g), vpos)
    scored = torch.ones(m - 2, dtype=torch.bool)
    with torch.no_grad():
        plain = unrolled_stages(draft, io, tokens, hidden, scored, 0, 0.1, return_outputs=True)[0].outputs
        seeing = unrolled_stages(draft, io, tokens, hidden, scored, 0, 0.1, visual=(vk, vv, vpos),
                                 return_outputs=True)[0].outputs
    torch.testing.assert_close(seeing[:3], plain[:3])  # text before the video cannot see it
    assert (seeing[3:] - plain[3:]).abs().amax(-1).min() > 1e-4  # text after it does
    assert pick_visual(6, 0.0, torch.Generator()).numel() == 0
    half = pick_visual(6, 0.5, torch.Generator().manual_seed(0))
    assert half.numel() == 3 and torch.equal(half, half.sort().values)
