"""The verify step's fixes (vllm_sparrow/v1_runner/verify_fixes.py) put each request's parameters
on its own drafted rows: a request's logit_bias on its rows only, whatever the drafts of the
requests before it (none included); min_p cuts what the plain sampler cuts; the named ids'
logprobs are read from each request's rows, request-major. The engine-level checks (greedy with
logit_bias token for token, min_p's distribution, named ids' logprobs against the target's) are
tests/test_lossless_sampling_matrix.py."""

from types import SimpleNamespace

import torch

from vllm_sparrow.v1_runner.verify_fixes import add_bias_per_drafted_row, cut_min_p, named_ids_logprobs

VOCAB = 11


def test_a_requests_bias_lands_on_its_drafted_rows_only():
    drafts = [2, 0, 3, 1]  # rows 0-1, none, 2-4, 5
    logits = torch.zeros(sum(drafts), VOCAB)
    add_bias_per_drafted_row(logits, {0: {7: 5.0}, 1: {3: -100.0}, 2: {1: 2.0, 7: -1.0}}, drafts)
    expected = torch.zeros(sum(drafts), VOCAB)
    expected[0:2, 7] = 5.0
    expected[2:5, 1], expected[2:5, 7] = 2.0, -1.0  # request 1 drafted nothing: its bias goes nowhere
    assert torch.equal(logits, expected)


def test_min_p_cuts_each_row_below_its_min_p_times_its_most_likely_token():
    """vLLM's MinPLogitsProcessor rule, row by row, each row with its own min_p (0: nothing cut)."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, VOCAB, generator=g) * 3
    min_p = torch.tensor([0.0, 0.1, 0.1, 0.5, 0.9, 0.1])
    cut = logits.clone()
    cut_min_p(cut, min_p)
    probs = logits.softmax(-1)
    keep = probs >= probs.max(-1, keepdim=True).values * min_p[:, None]
    assert torch.equal(torch.isinf(cut), ~keep) and torch.equal(cut[keep], logits[keep])
    assert not torch.isinf(cut[0]).any() and torch.isinf(cut[4]).any()


class _Sampler:
    """The two calls named_ids_logprobs makes of vLLM's Sampler, written out."""

    @staticmethod
    def compute_logprobs(logits):
        return logits.log_softmax(-1)

    @staticmethod
    def gather_specific_token_logprobs(logprobs, per_row, sampled):
        return per_row, sampled, logprobs


def test_named_ids_are_read_from_each_requests_rows():
    import vllm.v1.sample.rejection_sampler as rs

    # 2 requests drafting 2 and 1 tokens: logits rows [d0 d1 b0 | d0 b1]
    logits = torch.randn(5, VOCAB)
    metadata = SimpleNamespace(target_logits_indices=torch.tensor([0, 1, 3]), bonus_logits_indices=torch.tensor([2, 4]),
                               cu_num_sampled_tokens=torch.tensor([3, 5]))
    sampled = torch.tensor([[4, 5, 6], [7, rs.PLACEHOLDER_TOKEN_ID, rs.PLACEHOLDER_TOKEN_ID]])
    verify = SimpleNamespace(is_logits_logprobs_mode=False, sampler=_Sampler())
    per_row, tokens, logprobs = named_ids_logprobs(verify, {1: [9, 2]}, metadata, logits, logits[[0, 1, 3]],
                                                   logits[[2, 4]], sampled)
    assert per_row == {3: [9, 2], 4: [9, 2], 5: [9, 2]}  # request 1's positions, request-major (width 3)
    assert tokens.tolist() == [4, 5, 6, 7, 0, 0]
    rows = [0, 1, 2, 3, 4, 4]  # request 1's second and third positions past its rows: clamped, dropped later
    assert torch.allclose(logprobs, logits[rows].log_softmax(-1))
