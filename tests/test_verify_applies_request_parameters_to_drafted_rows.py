"""The verify step's fixes (vllm_sparrow/v1_runner/verify_fixes.py) put each request's parameters
on its own drafted rows: a request's logit_bias on its rows only, whatever the drafts of the
requests before it (none included); min_p cuts what the plain sampler cuts; the named ids'
logprobs are read from each request's rows, request-major, and in a step where requests naming
ids meet requests asking their top-k each row gets what its request asked. The engine-level checks (greedy with
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
    """The call named_ids_logprobs makes of vLLM's Sampler, written out."""

    @staticmethod
    def compute_logprobs(logits):
        return logits.log_softmax(-1)


def test_named_ids_are_read_from_each_requests_rows():
    import vllm.v1.sample.rejection_sampler as rs

    # 2 requests drafting 2 and 1 tokens: logits rows [d0 d1 b0 | d0 b1]
    logits = torch.randn(5, VOCAB)
    metadata = SimpleNamespace(target_logits_indices=torch.tensor([0, 1, 3]), bonus_logits_indices=torch.tensor([2, 4]),
                               cu_num_sampled_tokens=torch.tensor([3, 5]))
    sampled = torch.tensor([[4, 5, 6], [7, rs.PLACEHOLDER_TOKEN_ID, rs.PLACEHOLDER_TOKEN_ID]])
    verify = SimpleNamespace(is_logits_logprobs_mode=False, sampler=_Sampler())
    # request 1 names ids 9 and 2; request 0 asks its top 2
    out = named_ids_logprobs(verify, {1: [9, 2]}, 2, metadata, logits, logits[[0, 1, 3]], logits[[2, 4]], sampled)
    rows = [0, 1, 2, 3, 4, 4]  # request 1's second and third positions past its rows: clamped, dropped later
    logprobs = logits[rows].log_softmax(-1)
    top2 = logprobs[:3].topk(2, dim=-1).indices
    assert out.logprob_token_ids[:3, 1:].tolist() == top2.tolist()  # request 0, request-major (width 3)
    assert out.logprob_token_ids[3:].tolist() == [[7, 9, 2], [0, 9, 2], [0, 9, 2]]  # rejected: token 0
    assert out.logprob_token_ids[:3, 0].tolist() == [4, 5, 6]
    assert torch.allclose(out.logprobs, logprobs.gather(-1, out.logprob_token_ids.long()))


def test_each_row_gets_the_logprobs_its_request_asked():
    """A step where requests naming ids (logprob_token_ids) meet requests asking their top-k: each
    row's columns are what vLLM answers that request alone (gather_specific_token_logprobs for a
    named row, gather_logprobs for the others), padded with id 0 at -inf where a row asked fewer."""
    from vllm.v1.sample.sampler import Sampler

    from vllm_sparrow.v1_runner.verify_fixes import logprobs_per_request

    logprobs = torch.randn(4, VOCAB).log_softmax(-1)
    sampled = torch.tensor([3, 1, 4, 1])
    named = {1: [9], 3: [2, 7, 8, 5]}  # rows 0 and 2 ask their top 3
    out = logprobs_per_request(logprobs, named, sampled, 3)
    assert out.logprob_token_ids.shape == (4, 5)  # 1 + the most any row asked (4 named ids)
    alone_top = Sampler.gather_logprobs(logprobs, 3, sampled)
    for r in (0, 2):
        assert torch.equal(out.logprob_token_ids[r, :4].long(), alone_top.logprob_token_ids[r])
        assert torch.equal(out.logprobs[r, :4], alone_top.logprobs[r]) and out.logprobs[r, 4] == float("-inf")
    for r, ids in named.items():
        assert out.logprob_token_ids[r, :1 + len(ids)].tolist() == [sampled[r].item(), *ids]
        assert torch.equal(out.logprobs[r, :1 + len(ids)], logprobs[r, [sampled[r].item(), *ids]])
        assert torch.isinf(out.logprobs[r, 1 + len(ids):]).all()
    assert torch.equal(out.selected_token_ranks, alone_top.selected_token_ranks)
    # every row named: no top-k columns at all
    assert logprobs_per_request(logprobs, {r: [2] for r in range(4)}, sampled, 3).logprob_token_ids.shape == (4, 2)
