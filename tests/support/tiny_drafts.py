"""A tiny random Sparrow draft, a token I/O and a text-only captured sample whose response is
the 'target's' greedy path: the inputs of the drafter tests (dense reference, tree replay and
search, per-request state, the drafting choice)."""

import torch

from vllm_sparrow.config import SparrowConfig
from vllm_sparrow.model import SparrowDraftModel

H, V, D = 64, 40, 6


class IO:
    """A random embedding and LM head [vocab, H] (the draft's token I/O)."""

    def __init__(self, vocab: int = V, seed: int = 5):
        g = torch.Generator().manual_seed(seed)
        self.emb, self.head = torch.randn(vocab, H, generator=g), torch.randn(vocab, H, generator=g) / H**0.5

    def embed(self, ids):
        return self.emb[ids]

    def logits(self, h):
        return h @ self.head.T


def tiny_draft(anchors: int = 2, window: int | None = 7, vocab: int = V):
    """A one-layer draft of width H (4 heads, 2 KV heads of 16), weights N(0, 0.2) from seed 0."""
    cfg = SparrowConfig(hidden_size=H, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                        intermediate_size=96, vocab_size=vocab, anchor_tokens=anchors, window_tokens=window)
    torch.manual_seed(0)
    m = SparrowDraftModel(cfg)
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.2)
    return m.eval()


def greedy_sample(io, m=40, prompt=10):
    """A text-only sample whose response is the 'target's' greedy path (as captured)."""
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(m, H, generator=g)
    tokens = torch.randint(0, V, (m,), generator=g)
    greedy = io.logits(hidden).argmax(-1)
    tokens[prompt:] = torch.cat([tokens[prompt : prompt + 1], greedy[prompt : m - 1]])
    return {"token_ids": tokens, "text_hidden": hidden, "is_visual": torch.zeros(m, dtype=torch.bool),
            "prompt_len": torch.tensor([prompt])}
