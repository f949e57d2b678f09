"""The tree replay (training/tree_replay.py) that decides whether tree verification would pay:
its chains are exactly what the serving drafter drafts, its search's first level is the greedy
token, and verifying more tree nodes never accepts less."""

import torch

from vllm_sparrow.attention import TorchWindowAttention
from vllm_sparrow.config import SparrowConfig
from vllm_sparrow.drafter import SparrowDrafter, StepBatch
from vllm_sparrow.model import SparrowDraftModel
from vllm_sparrow.training.tree_replay import _greedy_chain, _Keys, replay_trees
from vllm_sparrow.window import WindowSpec

H, V, D = 64, 40, 6


class _IO:
    def __init__(self):
        g = torch.Generator().manual_seed(5)
        self.emb, self.head = torch.randn(V, H, generator=g), torch.randn(V, H, generator=g) / H**0.5

    def embed(self, ids):
        return self.emb[ids]

    def logits(self, h):
        return h @ self.head.T


def _model():
    cfg = SparrowConfig(hidden_size=H, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                        intermediate_size=96, vocab_size=V, anchor_tokens=2, window_tokens=7)
    torch.manual_seed(0)
    m = SparrowDraftModel(cfg)
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.2)
    return m.eval()


def _sample(io, m=40, prompt=10):
    """A text-only sample whose response is the 'target's' greedy path (as captured)."""
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(m, H, generator=g)
    tokens = torch.randint(0, V, (m,), generator=g)
    greedy = io.logits(hidden).argmax(-1)
    tokens[prompt:] = torch.cat([tokens[prompt : prompt + 1], greedy[prompt : m - 1]])
    return {"token_ids": tokens, "text_hidden": hidden, "is_visual": torch.zeros(m, dtype=torch.bool),
            "prompt_len": torch.tensor([prompt])}


def test_replayed_chains_are_what_the_serving_drafter_drafts():
    model, io = _model(), _IO()
    sample = _sample(io)
    tokens, hidden = sample["token_ids"], sample["text_hidden"]
    keys = _Keys(WindowSpec(2, 7))
    m = tokens.shape[0]
    y = model(hidden[: m - 1], io.embed(tokens[1:m]), torch.arange(m - 1), keys.dense(m - 1))
    for c in (12, 20, 31):
        chain = _greedy_chain(model, io, WindowSpec(2, 7), keys.k[:c], keys.v[:c], y[c - 1], c, D)
        drafter = SparrowDrafter(model, io, (), TorchWindowAttention(), torch.device("cpu"), torch.float32,
                                 max_requests=1, max_draft_tokens=D, max_text_tokens=64)
        batch = StepBatch.from_lists(["r"], tokens[:c], hidden[:c], [0], [c], [0], [10], tokens[c : c + 1], [False])
        served, _ = drafter.step(batch, D)
        assert chain == served[0].tolist(), c


def test_search_starts_greedy_and_bigger_trees_never_accept_less():
    model, io = _model(), _IO()
    r = replay_trees(model, io, [_sample(io, m=60)], max_depth=D, topk=3, tree_nodes=(1, 2, 4, 8, 16))
    assert r.points > 20
    assert r.search[1] == r.chain[1]  # the best depth-1 node is the greedy token
    assert r.tree[1] == r.chain[1]
    trees = [r.tree[n] for n in (1, 2, 4, 8, 16)]
    assert trees == sorted(trees), trees
    chains = [r.chain[d] for d in range(1, D + 1)]
    assert chains == sorted(chains) and chains[-1] > 0, chains
