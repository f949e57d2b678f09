"""Validation estimate of acceptance length: chain verification replayed on captured samples.

Runs the serve-time drafter itself (SparrowDrafter, its ring text-window cache, the torch
attention path) on the captured text stream, step by step as vLLM's verify loop does: prefill
the prompt, draft K tokens, accept the longest prefix the target's greedy choice agrees with,
feed the accepted tokens' target states back, repeat. The target's greedy choice at each
position is argmax(LM head(captured final state)); the replay follows the captured response,
so it is exact when responses are the target's own greedy answers (`sparrow capture` writes
those unless a dataset response is kept) and a replay of the dataset text otherwise.

Reported like vLLM: mean acceptance length = 1 + accepted / drafts (bonus token included).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch

from ..attention import TorchWindowAttention
from ..knobs import knob
from ..drafting.chain import ChainDrafting
from ..drafter import SparrowDrafter, StepBatch
from ..drafting.step import Drafts
from ..model import OwnTokenIO, SparrowDraftModel


@dataclass
class AcceptanceEstimate:
    drafts: int
    accepted: int
    per_position: list[int]  # accepted count at draft depth 1..K

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.accepted / self.drafts if self.drafts else float("nan")


def _verify(est: AcceptanceEstimate, drafts: list[int], tokens, greedy, c: int) -> int:
    """Greedy verification of one chain after verified token c: draft i proposes token c+1+i and
    is accepted while it equals the target's choice (and the stream follows that choice). Near
    the response's end the drafts past its last token are rejected, as vLLM's are past the end of
    a request (a deep chain is drafted whole at every step, its end included)."""
    accepted = 0
    for i, draft in enumerate(drafts[: len(tokens) - 1 - c]):
        if draft != int(greedy[c + i]) or int(tokens[c + 1 + i]) != int(greedy[c + i]):
            break
        accepted += 1
        est.per_position[i] += 1
    est.drafts += 1
    est.accepted += accepted
    return accepted


@torch.no_grad()
def estimate_acceptance(draft: SparrowDraftModel, target, samples, k: int) -> AcceptanceEstimate:
    """samples: iterable of captured samples (dicts from ShardReader)."""
    was_training = draft.training
    draft.eval()
    est = AcceptanceEstimate(0, 0, [0] * k)
    for sample in samples:
        _replay(draft, target, sample, k, est)
    draft.train(was_training)
    return est


def replayed_chains(draft, target, sample, k: int, drafting=None) -> Iterator[tuple[Drafts, int, int]]:
    """vLLM's greedy verify walk over one captured sample, chain by chain, with the serving
    drafter (`drafting`: its strategy, the plain chain by default): (the step's Drafts, drafts
    accepted, drafts the verifier could reach: the response's end cuts the last chains)."""
    is_visual = sample["is_visual"]
    tokens = sample["token_ids"][~is_visual]  # [m] text stream
    hidden = sample["text_hidden"].float()  # [m, H]
    p = int((~is_visual[: int(sample["prompt_len"])]).sum())  # prompt text tokens
    m = tokens.shape[0]
    greedy = target.logits(hidden).argmax(-1)  # [m] target's choice for the token after each
    drafter = SparrowDrafter(draft, OwnTokenIO(draft, target), (), TorchWindowAttention(),
                             hidden.device, hidden.dtype, max_requests=1, max_draft_tokens=k,
                             max_text_tokens=m + k + 1)
    lo, c = 0, p  # rows to feed start at lo; c = index of the newest verified token
    while c < m - 1:  # a response token is still to come
        batch = StepBatch.from_lists(["r"], tokens[lo:c], hidden[lo:c], [0], [c - lo], [lo], [p],
                                     tokens[c : c + 1], [False])
        drafts = (drafting or ChainDrafting()).step(drafter, batch, k)
        accepted = _verify(AcceptanceEstimate(0, 0, [0] * k), drafts.ids[0].tolist(), tokens, greedy, c)
        yield drafts, accepted, min(k, m - 1 - c)
        lo, c = c, c + accepted + 1  # verify step rows: the last verified token + accepted drafts
    drafter.release(["r"])


def _replay(draft, target, sample, k: int, est: AcceptanceEstimate) -> None:
    for _, accepted, _ in replayed_chains(draft, target, sample, k):
        est.drafts += 1
        est.accepted += accepted
        for i in range(accepted):
            est.per_position[i] += 1


@torch.no_grad()
def estimate_acceptance_full_stream(draft, target, samples, k: int) -> AcceptanceEstimate:
    """The same replay for the EAGLE-style baseline, which reads every position.

    Uses the MTP stages with teacher forcing: stage s at entry c-1+s is the draft's (s+1)-th
    chained proposal after committing token c when its earlier proposals were the true tokens,
    which is all that matters, since acceptance stops at the first wrong proposal.
    """
    from .eagle_baseline import full_stream
    from .objective import unrolled_stages

    was_training = draft.training
    draft.eval()
    est = AcceptanceEstimate(0, 0, [0] * k)
    for sample in samples:
        tokens, hidden, positions = full_stream(sample)
        m = tokens.shape[0]
        stages = unrolled_stages(draft, target, tokens, hidden, torch.zeros(m - 2, dtype=torch.bool), k - 1, 0.0,
                                 return_outputs=True, rope_positions=positions,
                                 first_entry=int(sample["prompt_len"]) - 1)  # the first proposal's entry
        proposals = [target.logits(s.outputs).argmax(-1) for s in stages]  # k x [m-2]
        greedy = target.logits(hidden).argmax(-1)  # [m]
        c = int(sample["prompt_len"])  # first response token: sampled after the prefill
        while c < m - 1:  # (stage s's proposals exist for entries up to m - 3: the end's are cut)
            c += _verify(est, [int(proposals[i][c - 1 + i]) for i in range(min(k, m - 1 - c))], tokens, greedy, c) + 1
    draft.train(was_training)
    return est


@torch.no_grad()
def estimate_acceptance_eagle3(draft, draft_io, target_io, samples, k: int, stream) -> AcceptanceEstimate:
    """The same replay for the EAGLE-3 baseline: stage s of the training-time test at entry
    c-1+s is its (s+1)-th chained proposal after token c (teacher-forced, which is exact up to
    the first rejection). stream(sample, device) -> (token ids [n], positions [n], aux [n, A*H])."""
    from .objective import unrolled_stages

    was_training = draft.training
    draft.eval()
    est = AcceptanceEstimate(0, 0, [0] * k)
    dev = next(draft.parameters()).device
    for sample in samples:
        tokens, positions, aux = stream(sample, dev)
        m = tokens.shape[0]
        stages = unrolled_stages(draft, draft_io, tokens, draft.fuse(aux), torch.zeros(m - 2, dtype=torch.bool,
                                 device=dev), k - 1, 0.0, return_outputs=True, rope_positions=positions,
                                 first_entry=int(sample["prompt_len"]) - 1)
        proposals = [draft_io.logits(s.outputs).argmax(-1) for s in stages]  # k x [m-2]
        is_visual = sample["is_visual"].to(dev)
        greedy = torch.full((m,), -1, dtype=torch.long, device=dev)  # the target's choice after each text token
        greedy[~is_visual] = target_io.logits(sample["text_hidden"].float().to(dev)).argmax(-1)
        c = int(sample["prompt_len"])
        while c < m - 1:
            c += _verify(est, [int(proposals[i][c - 1 + i]) for i in range(min(k, m - 1 - c))], tokens, greedy, c) + 1
    draft.train(was_training)
    return est


THRESHOLDS = (0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)
_WITH_CONFIDENCE = ChainDrafting(confidence=True)  # the chain adaptive length trims


@dataclass
class StopCalibration:
    """`sparrow calibrate-stop`: every option is a field here (knobs.py)."""

    draft: str = knob(help="Sparrow draft directory")
    capture: str = knob(help="capture of the draft's target; its last --samples samples are used")
    samples: int = knob(8, "held-out samples (the capture's last ones)")
    k: int | None = knob(None, "speculative tokens the server will draft (omit: the draft's recommended depth)")
    verify_token_cost: float = knob(0.1, "cost of one more verified token relative to a verify step's fixed cost")
    write: bool = knob(False, "store the best threshold in the draft's config.json")


@torch.no_grad()
def calibrate_stop_confidence(draft: SparrowDraftModel, target, samples, k: int, verify_token_cost: float,
                              thresholds=THRESHOLDS) -> tuple[float | None, dict]:
    """Pick the adaptive-length threshold on held-out samples (serving drafter, vLLM's verify walk).

    A verify step costs 1 + verify_token_cost x (tokens verified) relative units (the marginal
    cost of one more verified token against the step's fixed cost: ~0 on a GPU at small batch,
    larger when verification is compute-bound). For each threshold t, every replayed draft keeps
    its leading tokens whose cumulative draft confidence is >= t (at least one) and is accepted up
    to min(kept, accepted); the score is tokens produced per unit cost. Returns (best threshold,
    or None when drafting all K tokens scores best; {threshold or "off": score})."""
    points = []  # (cumulative confidences [k], accepted)
    was_training = draft.training
    draft.eval()
    for sample in samples:
        for drafts, accepted, _ in replayed_chains(draft, target, sample, k, _WITH_CONFIDENCE):
            points.append((drafts.confidence[0].cumprod(0).tolist(), accepted))
    draft.train(was_training)

    def score(t: float | None) -> float:
        made = cost = 0.0
        for cum, accepted in points:
            kept = k if t is None else max(1, sum(x >= t for x in cum))
            made += 1 + min(kept, accepted)
            cost += 1 + verify_token_cost * kept
        return made / cost if cost else 0.0

    scores = {"off": score(None), **{t: score(t) for t in thresholds}}
    best = max(scores, key=lambda key: scores[key])
    return (None if best == "off" else best), scores
