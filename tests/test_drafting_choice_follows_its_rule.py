"""drafting/choice.py's rule, one case per branch, on a tiny drafter: tree search when configured,
unless the runner budgets verification from per-position confidences (then the chain, said in the
log); adaptive length's stopping chain when a threshold is served; the plain chain without graphs;
the chain in CUDA graphs (here: their static buffers) otherwise, over the buckets and every depth
the schedule can ask for. And the inputs it reads: the tree's spec from the draft's config or the
variables, adaptive length off where the runner cannot take per-request lengths."""

import logging
from types import SimpleNamespace

import pytest
import torch

from support.tiny_drafts import IO, tiny_draft
from vllm_sparrow import LOGGER
from vllm_sparrow.attention import TorchWindowAttention
from vllm_sparrow.drafter import SparrowDrafter
from vllm_sparrow.drafting.chain import ChainDrafting, StoppingChainDrafting
from vllm_sparrow.drafting.choice import DraftingChoice, adaptive_length, choose_drafting, tree_spec
from vllm_sparrow.drafting.graphs import GraphDrafting
from vllm_sparrow.drafting.sampling import greedy
from vllm_sparrow.drafting.tree import TreeDrafting, TreeSpec

K = 4
TREE = TreeSpec(topk=3, budget=9)


def _drafter() -> SparrowDrafter:
    return SparrowDrafter(tiny_draft(), IO(), (7,), TorchWindowAttention(), torch.device("cpu"), torch.float32,
                          max_requests=4, max_draft_tokens=K, max_text_tokens=128)


def _choice(**kw) -> DraftingChoice:
    base = dict(tree=None, stop_confidence=None, graph_mode=None, buckets=(1, 2, 4))
    return DraftingChoice(**{**base, **kw})


def test_a_configured_tree_searches_every_greedy_step():
    peer = choose_drafting(_drafter(), K, _choice(tree=TREE, stop_confidence=0.3, graph_mode="eager"))
    assert isinstance(peer, TreeDrafting) and peer.spec == TREE and peer.stop_confidence == 0.3
    assert peer.describe()["tree"] == [3, 9]


def test_a_runner_that_reads_confidences_gets_the_chain_instead_of_the_tree_and_the_log_says_so(caplog):
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        peer = choose_drafting(_drafter(), K, _choice(tree=TREE, confidences_read=True))
    assert isinstance(peer, ChainDrafting)
    assert "tree search (topk 3, budget 9) is off" in caplog.text


def test_adaptive_length_drafts_the_stopping_chain_even_where_graphs_are_captured():
    peer = choose_drafting(_drafter(), K, _choice(stop_confidence=0.5, graph_mode="capture"))
    assert isinstance(peer, StoppingChainDrafting) and peer.stop_confidence == 0.5


def test_without_graphs_the_plain_chain_drafts():
    peer = choose_drafting(_drafter(), K, _choice())
    assert type(peer) is ChainDrafting and peer.describe()["decode_steps"] == "eager"


def test_with_graphs_the_chain_replays_them_for_each_bucket_and_scheduled_depth():
    recorder = type("Recorder", (), {"is_greedy": True, "__call__": lambda s, x, p: greedy(x, p),
                                     "kept": lambda s, b, k: None})()
    peer = choose_drafting(_drafter(), K, _choice(graph_mode="eager", depths=(1, 2, 9)), sample=recorder)
    assert isinstance(peer, GraphDrafting) and peer.describe()["decode_steps"] == "on static buffers"
    graphs = peer.graphs
    assert graphs.buckets == [1, 2, 4] and graphs.depths == [1, 2, K]  # 9 is past the draft's K
    assert graphs.sample is recorder  # the greedy sampler the graphs replay is the glue's


def test_the_tree_spec_comes_from_the_draft_config_and_the_variables_override_it(monkeypatch):
    monkeypatch.delenv("SPARROW_TREE_TOPK", raising=False)
    monkeypatch.delenv("SPARROW_TREE_BUDGET", raising=False)
    cfg = SimpleNamespace(tree_topk=4, tree_budget=None)  # what the rule reads of the draft's SparrowConfig
    assert tree_spec(cfg, K) == TreeSpec(4, 4 * (K - 1))
    assert tree_spec(SimpleNamespace(tree_topk=None, tree_budget=None), K) is None
    monkeypatch.setenv("SPARROW_TREE_TOPK", "off")
    assert tree_spec(cfg, K) is None
    monkeypatch.setenv("SPARROW_TREE_TOPK", "3")
    monkeypatch.setenv("SPARROW_TREE_BUDGET", "2")
    with pytest.raises(ValueError, match="tree_budget=2 is below tree_topk=3"):
        tree_spec(cfg, K)


def test_adaptive_length_is_off_where_the_runner_verifies_one_length_for_all(caplog):
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert adaptive_length(0.4, async_scheduling=False, per_request_lengths=False) is None
    assert "Model Runner V2 verifies the same number of drafts" in caplog.text
    assert adaptive_length(0.4, async_scheduling=False, per_request_lengths=True) == 0.4
