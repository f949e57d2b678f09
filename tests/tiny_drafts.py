"""A tiny random Sparrow draft, a token I/O and a text-only captured sample whose response is
the 'target's' greedy path: the inputs of the tree replay and tree search tests."""

import torch

from vllm_sparrow.config import SparrowConfig
from vllm_sparrow.model import SparrowDraftModel

H, V, D = 64, 40, 6


class IO:
    def __init__(self):
        g = torch.Generator().manual_seed(5)
        self.emb, self.head = torch.randn(V, H, generator=g), torch.randn(V, H, generator=g) / H**0.5

    def embed(self, ids):
        return self.emb[ids]

    def logits(self, h):
        return h @ self.head.T


def tiny_draft():
    cfg = SparrowConfig(hidden_size=H, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                        intermediate_size=96, vocab_size=V, anchor_tokens=2, window_tokens=7)
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
