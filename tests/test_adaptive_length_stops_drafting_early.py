"""Adaptive length's chain (drafting/chain.py, StoppingChainDrafting) stops drafting once no request
would verify more of it: what vLLM verifies is exactly what the full chain's cut leaves, at
batch 1 and 16 and with requests that do not draft in the batch, and the forwards it skips are
the ones past every request's cut. The engine-level check (greedy outputs unchanged, fewer
tokens verified) is test_deep_drafts_are_lossless.py's adaptive-length test."""

import pytest
import torch
from support.tiny_drafts import D, IO, greedy_sample, tiny_draft

from vllm_sparrow.attention import TorchWindowAttention
from vllm_sparrow.drafting.chain import ChainDrafting, StoppingChainDrafting, kept_drafts
from vllm_sparrow.drafting.step import greedy
from vllm_sparrow.drafter import SparrowDrafter, StepBatch, sampled


class SharpIO(IO):
    """The tiny draft's token I/O with peaked logits: its chains are sure of some tokens and
    unsure of others, as a trained draft is (the plain one is near uniform over 40 tokens)."""

    def logits(self, h):
        return super().logits(h) * 40


class CountingDrafter(SparrowDrafter):
    """The serving drafter, counting the chained forwards a strategy asks for."""

    forwards = 0

    def forward(self, *args, **kwargs):
        self.forwards += 1
        return super().forward(*args, **kwargs)


def _step(drafting, cuts, sample_fn=greedy, prefilling=()):
    """One step of len(cuts) requests that have seen different prefixes of one sample; the
    requests in `prefilling` are mid-prefill (they do not draft)."""
    model, io = tiny_draft(), SharpIO()
    s = greedy_sample(io)
    drafter = CountingDrafter(model, io, (), TorchWindowAttention(), torch.device("cpu"), torch.float32,
                              max_requests=len(cuts), max_draft_tokens=D, max_text_tokens=64)
    tokens, hidden = s["token_ids"], s["text_hidden"]
    batch = StepBatch.from_lists([f"r{i}" for i in range(len(cuts))], torch.cat([tokens[:c] for c in cuts]),
                                 torch.cat([hidden[:c] for c in cuts]), [sum(cuts[:i]) for i in range(len(cuts))],
                                 list(cuts), [0] * len(cuts), [10] * len(cuts), torch.stack([tokens[c] for c in cuts]),
                                 [i in prefilling for i in range(len(cuts))])
    torch.manual_seed(0)
    return drafting.step(drafter, batch, D, sample_fn), drafter.forwards


CUTS16 = tuple(11 + (7 * i) % 26 for i in range(16))  # 16 requests at 16 different places


@pytest.mark.parametrize("cuts,prefilling", [((12,), ()), ((31,), ()), (CUTS16, ()), (CUTS16, (0, 5, 9))],
                         ids=["batch1-a", "batch1-b", "batch16", "batch16-with-prefills"])
@pytest.mark.parametrize("threshold", [0.3, 0.5, 0.7, 0.9])
@torch.no_grad()
def test_what_vllm_verifies_is_the_full_chains_cut(cuts, prefilling, threshold):
    full, full_forwards = _step(ChainDrafting(confidence=True), cuts, prefilling=prefilling)
    stopped, forwards = _step(StoppingChainDrafting(threshold), cuts, prefilling=prefilling)
    drafting = [i for i in range(len(cuts)) if i not in prefilling]
    cut_full, cut_stopped = kept_drafts(full, threshold), kept_drafts(stopped, threshold)
    assert [cut_stopped[i] for i in drafting] == [cut_full[i] for i in drafting]
    # the chain drafts one token past the longest run of confident tokens: there it learns that
    # every chain has fallen below the threshold
    confident = (full.confidence.cumprod(1) >= threshold).sum(1)[drafting]  # [drafting requests]
    assert stopped.ids.shape[1] == min(D, int(confident.max()) + 1) and forwards == stopped.ids.shape[1] - 1
    assert full_forwards == D - 1


@torch.no_grad()
def test_at_batch_1_an_unsure_chain_skips_its_forwards_and_a_sure_one_drafts_all_k():
    drafted = {cut: _step(StoppingChainDrafting(0.7), (cut,))[0].ids.shape[1] for cut in range(11, 36)}
    assert min(drafted.values()) <= 2 and max(drafted.values()) == D, drafted
    stopped, forwards = _step(StoppingChainDrafting(0.9999), CUTS16)  # everybody below at once
    assert stopped.ids.shape[1] == 1 and forwards == 0
    stopped, forwards = _step(StoppingChainDrafting(1e-9), CUTS16)  # nobody falls below: all K
    assert stopped.ids.shape[1] == D and forwards == D - 1


@torch.no_grad()
def test_sampled_drafts_go_all_k():
    """Rejection sampling verifies every sampled draft against its q, so none is cut."""
    temps = torch.full((len(CUTS16),), 0.8)
    stopped, forwards = _step(StoppingChainDrafting(0.99), CUTS16, sampled(temps, torch.Generator().manual_seed(1)))
    assert stopped.ids.shape[1] == D and forwards == D - 1 and stopped.probs is not None
