"""The tree replay (training/tree_replay.py) that decides whether tree verification would pay:
its chains are exactly what the serving drafter drafts, its search's first level is the greedy
token, and verifying more tree nodes never accepts less."""

import torch
from support.tiny_drafts import D, IO, greedy_sample, tiny_draft

from vllm_sparrow.attention import TorchWindowAttention
from vllm_sparrow.drafter import SparrowDrafter, StepBatch
from vllm_sparrow.drafting.chain import CHAIN
from vllm_sparrow.training.tree_replay import _greedy_chain, _Keys, replay_trees
from vllm_sparrow.window import WindowSpec


def test_replayed_chains_are_what_the_serving_drafter_drafts():
    model, io = tiny_draft(), IO()
    sample = greedy_sample(io)
    tokens, hidden = sample["token_ids"], sample["text_hidden"]
    keys = _Keys(WindowSpec(2, 7))
    m = tokens.shape[0]
    y = model(hidden[: m - 1], io.embed(tokens[1:m]), torch.arange(m - 1), keys.dense(m - 1))
    for c in (12, 20, 31):
        chain = _greedy_chain(model, io, WindowSpec(2, 7), keys.k[:c], keys.v[:c], y[c - 1], c, D)
        drafter = SparrowDrafter(model, io, (), TorchWindowAttention(), torch.device("cpu"), torch.float32,
                                 max_requests=1, max_draft_tokens=D, max_text_tokens=64)
        batch = StepBatch.from_lists(["r"], tokens[:c], hidden[:c], [0], [c], [0], [10], tokens[c : c + 1], [False])
        served = CHAIN.step(drafter, batch, D).ids
        assert chain == served[0].tolist(), c


def test_search_starts_greedy_and_bigger_trees_never_accept_less():
    model, io = tiny_draft(), IO()
    r = replay_trees(model, io, [greedy_sample(io, m=60)], max_depth=D, topk=3, tree_nodes=(1, 2, 4, 8, 16))
    assert r.points > 20
    assert r.search[1] == r.chain[1]  # the best depth-1 node is the greedy token
    assert r.tree[1] == r.chain[1]
    trees = [r.tree[n] for n in (1, 2, 4, 8, 16)]
    assert trees == sorted(trees), trees
    chains = [r.chain[d] for d in range(1, D + 1)]
    assert chains == sorted(chains) and chains[-1] > 0, chains


def test_the_replay_reports_how_sure_the_target_is_of_its_response():
    model, io = tiny_draft(), IO()
    sample = greedy_sample(io, m=60, prompt=10)
    r = replay_trees(model, io, [sample, sample], max_depth=D, topk=3, tree_nodes=(1, 2))
    # entries 9..58 predict the 50 response tokens 10..59
    expected = io.logits(sample["text_hidden"][9:59]).softmax(-1).max(-1).values.mean()
    assert r.top1_tokens == 100
    assert abs(r.target_top1 - float(expected)) < 1e-6
    sharper = IO()
    sharper.head = io.head * 4  # same greedy choices, surer of each
    assert replay_trees(model, sharper, [sample], max_depth=D, topk=3, tree_nodes=(1,)).target_top1 > r.target_top1


def test_chains_and_the_search_run_to_their_own_depths():
    model, io = tiny_draft(), IO()
    r = replay_trees(model, io, [greedy_sample(io, m=60)], max_depth=D + 4, topk=3, tree_nodes=(2, 8),
                     search_depth=3)
    assert sorted(r.chain) == list(range(1, D + 5)) and sorted(r.search) == [1, 2, 3] and r.search_depth == 3
    assert r.search[1] == r.chain[1]


def test_sample_and_match_counts_along_the_captured_path():
    from vllm_sparrow.training.tree_replay import _sampled_accepted

    p = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3], [0.2, 0.2, 0.6]])  # p at each step of truth 0 2 2
    # the module's worked example: chain 0 1 against truth 0 2: p0(0) + p0(0) p1(1)
    assert abs(_sampled_accepted([[0], [0, 1]], p, [0, 2, 2]) - (0.5 + 0.5 * 0.6)) < 1e-6
    # a tree with both children at depth 2 and the path going on: 0.5 + 0.5 (0.6 + 0.3) + 0.5 * 0.3 * 0.6
    tree = [[0], [0, 1], [0, 2], [0, 2, 2]]
    assert abs(_sampled_accepted(tree, p, [0, 2, 2]) - (0.5 + 0.5 * 0.9 + 0.5 * 0.3 * 0.6)) < 1e-6
    assert _sampled_accepted([[1]], p, [0, 2, 2]) == _sampled_accepted([[1], [1, 0]], p, [0, 2, 2])  # off-path: ends


def test_sampled_replay_tends_to_the_greedy_one_as_the_temperature_falls_and_trees_never_accept_less():
    model, io = tiny_draft(), IO()
    sample = greedy_sample(io, m=60)
    cold = replay_trees(model, io, [sample], max_depth=D, topk=3, tree_nodes=(1, 4, 16), temperature=1e-4)
    for d in range(1, D + 1):
        assert abs(cold.sampled_chain[d] - cold.chain[d]) < 1e-3, d
    for n in (1, 4, 16):
        assert abs(cold.sampled_tree[n] - cold.tree[n]) < 1e-3, n
    warm = replay_trees(model, io, [sample], max_depth=D, topk=3, tree_nodes=(1, 4, 16), temperature=0.7)
    trees = [warm.sampled_tree[n] for n in (1, 4, 16)]
    chains = [warm.sampled_chain[d] for d in range(1, D + 1)]
    assert trees == sorted(trees) and chains == sorted(chains), (trees, chains)
    # sampling accepts some tokens the greedy target would not (any token with p > 0 can match)
    assert warm.sampled_tree[16] > cold.sampled_tree[16] or warm.sampled_chain[1] != cold.sampled_chain[1]
