"""Per-position confidences for vLLM 0.34's adaptive verification, from Sparrow's draft logits.

With `enable_adaptive_verification`, 0.34's runner sizes each request's verification budget
(spec_decode/adaptive_verification.py: survival = the running product of per-position
confidences, the budget that maximises tokens per unit of profiled cost) from the speculator's
`draft_token_confidence_probs` [max_num_reqs, K], read by batch row after every propose(). Its
DraftModelSpeculator base writes them inside its own draft sampling, through its
OnlineAcceptanceEstimator; Sparrow samples its drafts itself, so it hands that estimator its
draft logits at every chained position: `ConfidenceRecorder` wraps the step's sampler and calls
the estimator's predict() on the logits [B, Vd] before the token is chosen.

What the estimator computes: p = sigmoid(slope * f + b_k), f = logit(max q) of the draft
distribution q (after the request's temperature) at position k, refit online every 100 steps
from the runner's verdicts (observe_verification, which the runner calls before each propose).
It scores the distribution, never the drawn token, so trimming a sampled draft does not select
on the token trimmed: verification stays lossless (a confidence of the drawn token would bias
sampled outputs towards the draft's modes).

Why the estimator and not Sparrow's own max q: sigmoid(1 * logit(q) + 0) = q, so the draft's own
probability is the estimator at slope 1, intercept 0, one member of the family it fits. Sparrow
starts it there (`start_from_draft_probabilities`; vLLM's cold start, slope 0.5 and intercept
-0.2, is a median fitted on other drafters) and lets the online fit move it only where the
verdicts say the draft is over- or under-confident.

Everything here reads persistent buffers (the speculator's idx_mapping and temperature by
request-state slot, the estimator's tensors), so the recorder can sit inside the decode step's
CUDA graphs (drafting/graphs.py): a graph's padding rows carry slot -1, which the estimator skips.
"""

from __future__ import annotations

import torch

from ..drafting.sampling import Sampler, greedy


class ConfidenceRecorder:
    """A sampler (drafting/sampling.py) that first feeds each position's draft logits to vLLM's
    acceptance estimator, which writes the position's confidences, then samples with `inner`."""

    def __init__(self, estimator, slots: torch.Tensor, temperature: torch.Tensor, confidences: torch.Tensor,
                 inner: Sampler = greedy) -> None:
        """slots [max_num_reqs] request-state slot of each batch row (-1 past the batch);
        temperature [max_num_reqs] by slot; confidences [max_num_reqs, K] by batch row."""
        self.estimator, self.slots, self.temperature, self.confidences = estimator, slots, temperature, confidences
        self.inner = inner
        self.is_greedy = inner.is_greedy  # it chooses nothing itself
        # [K] the position of each chained forward, as the 0-dim tensor the estimator reads
        self.positions = torch.arange(confidences.shape[1], dtype=torch.int64, device=confidences.device)

    def around(self, inner: Sampler) -> ConfidenceRecorder:
        """The same recorder in front of another sampler (a step's sampled draft)."""
        return ConfidenceRecorder(self.estimator, self.slots, self.temperature, self.confidences, inner)

    def __call__(self, logits: torch.Tensor, position: int):
        n = logits.shape[0]  # [B, Vd] batch rows (a graph bucket's padding included)
        self.estimator.predict(logits, self.slots[:n], self.positions[position], self.confidences, self.temperature)
        return self.inner(logits, position)

    def kept(self, batch: int, num_draft: int):
        return self.inner.kept(batch, num_draft)


def start_from_draft_probabilities(estimator) -> None:
    """The estimator's coefficients before any verdict: slope 1, intercepts 0, so its first
    confidences are the draft's own max probabilities (sigmoid(logit(q)) = q)."""
    estimator.slope.fill_(1.0)
    estimator.intercepts.zero_()
