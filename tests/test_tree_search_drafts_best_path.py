"""Tree search inside the serving drafter (drafting/tree.py): it hands over the best path the
replay's EAGLE-2 search finds (two implementations, one batched over requests with
branch-private scratch, one per sample with dense attention), a one-branch search is exactly the
greedy chain, and a reduced budget narrows only the deep levels. The engine-level checks
(greedy outputs unchanged on every target, T > 0 distribution) are in
test_greedy_lossless_per_target.py and test_sampling_distribution_matches_target.py."""

import pytest
import torch
from support.tiny_drafts import D, IO, greedy_sample, tiny_draft

from vllm_sparrow.attention import TorchWindowAttention
from vllm_sparrow.drafting.chain import ChainDrafting
from vllm_sparrow.drafting.step import greedy
from vllm_sparrow.drafter import SparrowDrafter, StepBatch
from vllm_sparrow.training.tree_replay import _Keys, _search
from vllm_sparrow.drafting.choice import tree_spec
from vllm_sparrow.drafting.tree import TreeDrafting, TreeSpec
from vllm_sparrow.window import WindowSpec

CUTS = (12, 20, 31)  # committed text entries of the three requests of one batch


def _drafter(model, io):
    return SparrowDrafter(model, io, (), TorchWindowAttention(), torch.device("cpu"), torch.float32,
                          max_requests=4, max_draft_tokens=D, max_text_tokens=64)


def _batch_step(drafter, sample, drafting=ChainDrafting(), cuts=CUTS, k=D):
    """One prefill step for three requests that have seen different prefixes of the sample:
    the drafts of `drafting` (the greedy chain unless told)."""
    tokens, hidden = sample["token_ids"], sample["text_hidden"]
    toks = torch.cat([tokens[:c] for c in cuts])
    hid = torch.cat([hidden[:c] for c in cuts])
    starts = [sum(cuts[:i]) for i in range(len(cuts))]
    nxt = torch.stack([tokens[c] for c in cuts])
    batch = StepBatch.from_lists([f"r{i}" for i in range(len(cuts))], toks, hid, starts, list(cuts),
                                 [0] * len(cuts), [10] * len(cuts), nxt, [False] * len(cuts))
    drafts = drafting.step(drafter, batch, k, greedy)
    assert drafts.probs is None
    return drafts


def _replay_best_paths(model, io, sample, topk):
    tokens, hidden = sample["token_ids"], sample["text_hidden"]
    spec = WindowSpec(2, 7)
    keys = _Keys(spec)
    m = tokens.shape[0]
    y = model(hidden[: m - 1], io.embed(tokens[1:m]), torch.arange(m - 1), keys.dense(m - 1))
    best = []
    for c in CUTS:
        nodes = _search(model, io, spec, keys.k[:c], keys.v[:c], y[c - 1], c, D, topk)
        deepest = [nd for nd in nodes if len(nd[1]) == D]
        best.append(max(deepest, key=lambda nd: nd[0])[1])
    return best


@torch.no_grad()
def test_served_search_returns_the_replay_searchs_best_path():
    model, io = tiny_draft(), IO()
    sample = greedy_sample(io)
    served = _batch_step(_drafter(model, io), sample, TreeDrafting(TreeSpec(topk=3, budget=3 * (D - 1)))).ids
    assert served.tolist() == _replay_best_paths(model, io, sample, topk=3)
    chain = _batch_step(_drafter(model, io), sample).ids
    assert not torch.equal(served, chain), "the search must find paths the greedy chain does not"


@torch.no_grad()
def test_one_branch_search_is_the_greedy_chain():
    """Width 1 at every level: the branch-private keys must reproduce the chain's attention."""
    model, io = tiny_draft(), IO()
    sample = greedy_sample(io)
    chain = _batch_step(_drafter(model, io), sample).ids
    assert torch.equal(_batch_step(_drafter(model, io), sample, TreeDrafting(TreeSpec(topk=1, budget=1))).ids, chain)


@torch.no_grad()
def test_confidence_of_the_searched_path_is_its_draft_probability():
    model, io = tiny_draft(), IO()
    searched = _batch_step(_drafter(model, io), greedy_sample(io), TreeDrafting(TreeSpec(topk=3, budget=6), stop_confidence=0.5))
    ids, conf = searched.ids, searched.confidence  # [B, K]
    assert conf.shape == ids.shape and bool(((conf > 0) & (conf <= 1)).all())
    # Chains agree with the search on the first token (the root's argmax is its best child
    # whenever the chosen path starts there): the first confidences match the chain's then.
    chain = _batch_step(_drafter(model, io), greedy_sample(io), ChainDrafting(confidence=True))
    same = ids[:, 0] == chain.ids[:, 0]
    assert bool(same.any())
    torch.testing.assert_close(conf[same, 0], chain.confidence[same, 0])
    without = _batch_step(_drafter(model, io), greedy_sample(io), TreeDrafting(TreeSpec(topk=3, budget=6)))
    assert without.confidence is None and torch.equal(without.ids, ids)


def test_budget_keeps_the_first_levels_wide():
    assert TreeSpec(3, 6).widths(D) == [3, 3, 1, 1, 1]
    assert TreeSpec(3, 100).widths(4) == [3, 3, 3]


def test_tree_knobs_from_config_and_environment(monkeypatch):
    cfg = tiny_draft().cfg
    assert tree_spec(cfg, 4) is None  # off by default: today's chain
    monkeypatch.setenv("SPARROW_TREE_TOPK", "4")
    assert tree_spec(cfg, 4) == TreeSpec(4, 12)  # default budget: topk nodes at every level
    monkeypatch.setenv("SPARROW_TREE_BUDGET", "2")
    with pytest.raises(ValueError, match="at least 4"):
        tree_spec(cfg, 4)
    monkeypatch.setenv("SPARROW_TREE_TOPK", "off")
    assert tree_spec(cfg.replace(tree_topk=3), 4) is None
    monkeypatch.delenv("SPARROW_TREE_TOPK")
    monkeypatch.delenv("SPARROW_TREE_BUDGET")
    assert tree_spec(cfg.replace(tree_topk=3, tree_budget=5), 4) == TreeSpec(3, 5)
    monkeypatch.setenv("SPARROW_TREE_TOPK", "two")
    with pytest.raises(ValueError, match="whole number"):
        tree_spec(cfg, 4)


@torch.no_grad()
def test_search_of_one_request_matches_its_search_in_a_batch():
    """A batch of one lays its branches out as stride-0 views: the compiled ops need them dense."""
    model, io = tiny_draft(), IO()
    sample = greedy_sample(io)
    tree = TreeDrafting(TreeSpec(3, 3 * (D - 1)))
    alone = _batch_step(_drafter(model, io), sample, tree, cuts=(20,)).ids
    batched = _batch_step(_drafter(model, io), sample, tree).ids
    assert alone.tolist() == batched[1:2].tolist()
