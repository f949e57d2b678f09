"""The chain peers: K chained draft forwards per request, and adaptive length's chain that stops
once no request would verify more of it (a drafting strategy each, drafting/step.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch

from ..window import WindowBatch
from .step import Committed, DraftCore, Drafts, Plain, Proposal, Sampler, greedy


def chain_proposals(drafter: DraftCore, c: Committed, num_draft: int, sample: Sampler,
                    confidence: bool) -> Iterator[Proposal]:
    """The chain's proposals, position by position: each is proposed from the previous one's
    state, and the forward that makes the next state runs only when the caller asks for it (a
    chain that stops early skips its remaining forwards). The chained entries take text indices
    c, c + 1, ...: scratch that no later step reads (the next step commits over those indices)."""
    y = c.state  # [B, H]
    for step in range(num_draft):
        p = drafter.propose(y, sample, confidence, step)
        yield p
        if step == num_draft - 1:
            return
        pos = c.committed + step  # [B] text index of the chained entry
        wb = WindowBatch(c.slots, pos[:, None], c.drafting[:, None], pos)
        y = drafter.forward(y, p.ids[:, None], wb, drafter.chain_attention(c, wb))


def stacked(c: Committed, proposals: list[Proposal], sample: Sampler = greedy) -> Drafts:
    """Drafts [B, len(proposals)] of the proposals in chain order (0 for requests not drafting)."""
    if not proposals:
        return Drafts(torch.zeros(len(c.slots), 0, dtype=torch.long, device=c.slots.device))
    ids = torch.where(c.drafting[:, None], torch.stack([p.ids for p in proposals], 1), 0)  # [B, K]
    conf = [p.confidence for p in proposals if p.confidence is not None]
    is_sampled = any(p.sampled for p in proposals)
    kept = sample.kept(*ids.shape) if is_sampled else None  # [B, K, vocab] or None
    return Drafts(ids, is_sampled, kept, torch.stack(conf, 1) if conf else None)


@dataclass(frozen=True)
class ChainDrafting(Plain):
    """K autoregressive draft tokens per request from its last committed entry."""

    confidence: bool = False  # keep each drafted token's draft probability (adaptive length)
    name: str = "chain"

    def draft(self, drafter: DraftCore, c: Committed, num_draft: int, sample: Sampler = greedy) -> Drafts:
        return stacked(c, list(chain_proposals(drafter, c, num_draft, sample, self.confidence)), sample)


CHAIN = ChainDrafting()  # the plain chain (greedy or sampled): what tools and tests draft with


def kept_drafts(drafts: Drafts, stop_confidence: float) -> list[list[int]]:
    """Adaptive length's cut: each request's drafts up to where their cumulative draft
    confidence falls below stop_confidence (at least one), as host lists (vLLM takes a draft
    length per request as a list of lists, as from its ngram proposer)."""
    keep = (drafts.confidence.cumprod(1) >= stop_confidence).sum(1).clamp(min=1)  # [B]
    return [row[:n] for row, n in zip(drafts.ids.tolist(), keep.tolist())]


@dataclass(frozen=True)
class StoppingChainDrafting(Plain):
    """Adaptive length's chain: the greedy chain, which stops drafting once every drafting
    request's cumulative draft confidence has fallen below `stop_confidence`. vLLM verifies only
    each request's tokens at or above it (at least one; kept_drafts), so the tokens not
    drafted are ones nobody would verify, and at batch 1 a stopped chain saves its forwards as
    well as their verification (the saving `sparrow tune` prices a stopped token at). The check
    reads one flag back per position: adaptive length reads its drafts back anyway.
    Sampled drafts go all K: rejection sampling verifies each against the q it was drawn from."""

    stop_confidence: float
    name: str = "chain, adaptive length"

    def draft(self, drafter: DraftCore, c: Committed, num_draft: int, sample: Sampler = greedy) -> Drafts:
        if not sample.is_greedy:
            return ChainDrafting(confidence=True).draft(drafter, c, num_draft, sample)
        proposals, cumulative = [], torch.ones(len(c.slots), device=c.slots.device)  # [B]
        for p in chain_proposals(drafter, c, num_draft, sample, confidence=True):
            proposals.append(p)
            cumulative = cumulative * p.confidence.float()
            if not bool((c.drafting & (cumulative >= self.stop_confidence)).any()):
                break  # every chain is past its last verified token
        return stacked(c, proposals, sample)

    def per_request(self, drafts: Drafts) -> list[list[int]] | None:
        # sampled drafts are verified in full: each against the q it was drawn from
        return None if drafts.sampled else kept_drafts(drafts, self.stop_confidence)
