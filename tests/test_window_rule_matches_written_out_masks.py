"""The text-anchored window rule, pinned against masks written out by hand: a query at text
index p reads key i when i <= p and (i < A or i > p - W): the A first text tokens and the last W
(itself included). Checked on the training mask (WindowSpec.mask), on the kernels' reference
arithmetic (key_visible), on the tests' own dense reference (tests/support/dense_reference.py), and
through the serving attention paths themselves (the torch backend's commit and chained
forwards, and the kernels' torch reference), over a ring that wraps, with padding rows; plus
the ring's worked examples of window.py and window_attention_ref.py."""

import pytest
import torch
from support.dense_reference import window_mask

from vllm_sparrow.attention import TorchWindowAttention
from vllm_sparrow.window import TextWindowCache, WindowBatch, WindowSpec
from vllm_sparrow_kernels.window_attention_ref import (
    key_visible,
    ring_row,
    ring_stored_index,
    ring_window_attention_ref,
)

# Row p: query at text index p; column i: key at text index i; "x": the query reads the key.
A2_W3 = """
x............
xx...........
xxx..........
xxxx.........
xxxxx........
xx.xxx.......
xx..xxx......
xx...xxx.....
xx....xxx....
xx.....xxx...
xx......xxx..
xx.......xxx.
xx........xxx
"""
A0_W2 = """
x.....
xx....
.xx...
..xx..
...xx.
....xx
"""
A1_ALL = """
x....
xx...
xxx..
xxxx.
xxxxx
"""
CASES = {"A=2, W=3": (2, 3, A2_W3), "A=0, W=2": (0, 2, A0_W2), "A=1, no window": (1, None, A1_ALL)}


def _grid(text: str) -> torch.Tensor:
    return torch.tensor([[c == "x" for c in line] for line in text.split()])


def _visible_sets(text: str) -> dict[int, set[int]]:
    return {p: {i for i, c in enumerate(line) if c == "x"} for p, line in enumerate(text.split())}


@pytest.mark.parametrize("case", CASES)
def test_the_training_mask_is_the_written_out_mask(case):
    anchors, window, text = CASES[case]
    expected = _grid(text)
    idx = torch.arange(expected.shape[0])
    assert torch.equal(WindowSpec(anchors, window).mask(idx, idx), expected)


@pytest.mark.parametrize("case", CASES)
def test_the_kernel_reference_mask_is_the_written_out_mask(case):
    anchors, window, text = CASES[case]
    expected = _grid(text)
    idx = torch.arange(expected.shape[0])[None]  # [1, n]
    assert torch.equal(key_visible(idx, idx, anchors, window or 0)[0], expected)


@pytest.mark.parametrize("case", CASES)
def test_the_tests_dense_reference_mask_is_the_written_out_mask(case):
    anchors, window, text = CASES[case]
    expected = _grid(text)
    assert torch.equal(window_mask(expected.shape[0], anchors, window), expected)


def test_the_ring_worked_examples():
    # window.py: A = 2, R = 4: text indices 0..9 land in rows 0 1 | 2 3 4 5 2 3 4 5
    assert ring_row(torch.arange(10), 2, 4).tolist() == [0, 1, 2, 3, 4, 5, 2, 3, 4, 5]
    # window_attention_ref.py: after indices 0..8, rows 0..5 hold 0 1 6 7 8 5
    assert ring_stored_index(torch.tensor([9]), 2, 4).tolist() == [[0, 1, 6, 7, 8, 5]]
    assert ring_stored_index(torch.tensor([3]), 2, 4).tolist() == [[0, 1, 2, -1, -1, -1]]  # not yet written


# Forwards of one request through a ring of A + W + K rows (K = 2): a prompt chunk 0..5, a
# verify-like forward 6..9 with a padding row, a chained forward at 10 (scratch), the next step's
# commit over it (10..11), and another chained forward at 12. By index 12 the ring has wrapped.
FORWARDS = [("commit", [0, 1, 2, 3, 4, 5], 6), ("commit", [6, 7, 8, 9, 99], 4), ("chain", [10], 1),
            ("commit", [10, 11], 2), ("chain", [12], 1)]
K, HEADS, D = 2, 2, 16  # two query heads on one KV head (GQA), values one-hot in D >= 13


def _rows(positions, valid_n):
    """q = 0 makes every visible key weigh the same, and value i is the one-hot e_i, so the
    output row is the mean of e_i over the keys the query read: its support is the visible set."""
    L = len(positions)
    pos = torch.tensor([positions])  # [1, L]
    valid = torch.arange(L)[None] < valid_n
    q = torch.zeros(1, L, HEADS, D)
    k = torch.randn(1, L, 1, D)
    v = torch.nn.functional.one_hot(pos.clamp(max=D - 1), D).float()[:, :, None, :]  # [1, L, 1, D]
    return pos, valid, q, k, v


def _seen(out, positions, valid_n) -> dict[int, set[int]]:
    return {p: set(torch.nonzero(out[0, u, h] > 1e-6).flatten().tolist())
            for u, p in enumerate(positions[:valid_n]) for h in range(HEADS)}


def _check(seen: dict[int, set[int]], expected: dict[int, set[int]]):
    for p, keys in seen.items():
        assert keys == expected[p], f"query {p} read {sorted(keys)}, the rule says {sorted(expected[p])}"


def test_the_torch_serving_path_reads_exactly_the_written_out_keys():
    expected = _visible_sets(A2_W3)
    spec = WindowSpec(2, 3)
    cache = TextWindowCache(spec, 1, K, 64, 1, D, torch.float32, "cpu")
    backend, slots, cache_len, ctx, checked = TorchWindowAttention(), torch.tensor([0]), 0, None, set()
    for kind, positions, valid_n in FORWARDS:
        pos, valid, q, k, v = _rows(positions, valid_n)
        if kind == "commit":
            wb = WindowBatch(slots, pos, valid, torch.tensor([cache_len]))
            out, ctx = backend.commit(cache, wb, q, k, v)
            cache_len += valid_n
        else:
            out = backend.chain(cache, ctx, WindowBatch(slots, pos, valid, pos[:, 0]), q, k, v)
        seen = _seen(out, positions, valid_n)
        _check(seen, expected)
        checked |= set(seen)
    assert checked == set(range(13))


def test_the_kernel_reference_reads_exactly_the_written_out_keys():
    """The Triton kernels' contract (tests/test_triton_window_attention_matches_torch.py holds
    the compiled kernels to this reference). Chained forwards store their scratch entry in the
    ring, as the Triton path does."""
    expected = _visible_sets(A2_W3)
    anchors, window, ring = 2, 3, 3 + K
    kc, vc = torch.zeros(2, 1, anchors + ring, D), torch.zeros(2, 1, anchors + ring, D)  # + the sink slot
    slots, cache_len, checked = torch.tensor([0]), 0, set()
    for kind, positions, valid_n in FORWARDS:
        pos, valid, q, k, v = _rows(positions, valid_n)
        out = ring_window_attention_ref(q, k, v, kc, vc, slots, pos, valid, torch.tensor([cache_len]), anchors,
                                        window, ring, D ** -0.5)
        if kind == "commit":
            cache_len += valid_n
        seen = _seen(out, positions, valid_n)
        _check(seen, expected)
        checked |= set(seen)
    assert checked == set(range(13))
