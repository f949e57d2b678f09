"""How a draft token is chosen at each chained position, and the interface of the store a sampled
draft's distribution is kept in for vLLM's rejection sampler.

    greedy    the argmax: a point-mass draft, which vLLM verifies exactly at any temperature
    Sampled   drawn from q_b = softmax(logits_b / T_b) per request (a greedy request, T_b below
              GREEDY_TEMPERATURE, drafts its argmax); q goes to a store, position by position
A sampler says itself whether it is greedy (`is_greedy`) and where its step's q is kept (`kept`).

A sampled draft is lossless only if the rejection sampler is told the very q it was drawn from,
and q is a [vocab] row per drafted token: at vLLM's GPU defaults (1,024 requests, K = 8, a
152,064-token vocabulary) a [B, K, vocab] float32 tensor is 5 GB. So q is never stacked here:
each position's q is made inside the storage vLLM reads, and the token is drawn from that.

Each runner's store lives with its glue:
    QBuffer    the V1 runner (v1_runner/q_buffer.py): the runner takes q as [B, K, vocab] float32 after
               propose() (take_last_draft_probs). One buffer [max_requests, K, vocab] allocated
               once, when the draft loads (so vLLM's memory profile counts it, unlike vLLM's own
               EAGLE, whose stacked probabilities are made per step outside the profile); each
               position's q is computed in place in its [B, vocab] slice.
    LogitRows  Model Runner V2 (v2_runner/draft_logits.py): the runner keeps pre-temperature draft logits in its
               own cache [max_num_reqs, K, vocab] in the LM head's dtype (vLLM's allocation) and
               verifies with softmax(stored / T). The logits are rounded into the request's row
               first and the token is drawn from softmax(rounded / T): with a bf16 head, q from the
               unrounded logits would differ from the verifier's by up to ~1% per token.
HeldQ, here, keeps q in a tensor of its own (tests and tools, where no runner reads it).
A step's transient memory is a few [B, vocab] rows (the logits, their float copy, the race's
noise), which the drafter's profile_step runs at the engine's largest batch.
"""

from __future__ import annotations

from typing import Protocol

import torch

from .noise import RequestNoise

GREEDY_TEMPERATURE = 1e-5  # vLLM's threshold: a request at a lower temperature is greedy


class Sampler(Protocol):
    is_greedy: bool  # every draft is the argmax (a point mass): no q is kept

    def __call__(self, logits: torch.Tensor, position: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """logits [B, Vd] of chained position `position` -> (token columns [B], q [B, Vd] float32
        the columns were drawn from, or None: a deterministic draft)."""

    def kept(self, batch: int, num_draft: int) -> torch.Tensor | None:
        """The step's q [B, K, vocab] where the runner reads it as one tensor (the V1 runner's
        QBuffer: a view), else None (kept elsewhere, or none)."""


class Greedy:
    """The argmax at every position (`greedy`, the one instance)."""

    is_greedy = True

    def __call__(self, logits: torch.Tensor, position: int = 0) -> tuple[torch.Tensor, None]:
        return logits.argmax(dim=-1), None

    def kept(self, batch: int, num_draft: int) -> None:
        return None


greedy = Greedy()


class QStore(Protocol):
    """Where a sampled draft's distribution is kept for verification (one per engine)."""

    def distribution(self, logits: torch.Tensor, temperature: torch.Tensor, is_greedy: torch.Tensor,
                     position: int) -> torch.Tensor:
        """Record position `position`'s draft distribution of logits [B, Vd] (draft columns) at
        temperature [B] and return q [B, Vd] float32: exactly what the verifier will read."""

    def kept(self, batch: int, num_draft: int) -> torch.Tensor | None:
        """The step's q [B, K, vocab] as one tensor (a view), or None where the runner keeps it."""


class Sampled:
    """The sampled draft: row b drawn from q_b, which `store` keeps for vLLM's rejection sampler.
    temperature: [>= B] per request (batch order). noise: the race's Exp(1) noise, a RequestNoise
    (keyed by each request's seed and position: seeded requests repeat, drafting/noise.py) or a
    torch.Generator (the engine's stream; None: torch's default)."""

    is_greedy = False

    def __init__(self, temperature: torch.Tensor, noise: torch.Generator | RequestNoise | None,
                 store: QStore) -> None:
        self.temperature, self.noise, self.store = temperature, noise, store

    def __call__(self, logits: torch.Tensor, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        temp = self.temperature[: logits.shape[0]].float()  # [B]
        is_greedy = temp < GREEDY_TEMPERATURE
        argmax = logits.argmax(-1)  # [B] before the store may reuse the logits' memory
        q = self.store.distribution(logits, torch.where(is_greedy, 1.0, temp), is_greedy, position)  # [B, Vd]
        # Exponential race: argmax(q / E), E ~ Exp(1), is a draw from q, without torch.multinomial's
        # host-side checks; the noise buffer becomes q / E in place (one [B, Vd] temporary).
        if isinstance(self.noise, RequestNoise):
            race = self.noise.exponential(q, position)
        else:
            race = torch.empty_like(q).exponential_(generator=self.noise)
        ids = torch.where(is_greedy, argmax, race.reciprocal_().mul_(q).argmax(-1))  # [B]
        one_hot_rows(q, is_greedy, argmax)
        return ids, q

    def kept(self, batch: int, num_draft: int) -> torch.Tensor | None:
        return self.store.kept(batch, num_draft)


def sampled(temperature: torch.Tensor, noise: torch.Generator | RequestNoise | None,
            store: QStore | None = None) -> Sampled:
    """A Sampled draft; without a store, q is kept in a HeldQ (tests and tools)."""
    return Sampled(temperature, noise, store if store is not None else HeldQ())


def one_hot_rows(q: torch.Tensor, rows: torch.Tensor, ids: torch.Tensor) -> None:
    """Set q's rows where `rows` [B] to one-hot at ids [B], in place, without a host read: a greedy
    request's draft is a point mass."""
    q.mul_((~rows)[:, None].to(q.dtype))
    q.scatter_add_(1, ids[:, None], rows[:, None].to(q.dtype))


def softmax_(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dimension of a float tensor, in place (no [B, vocab] copy)."""
    return x.sub_(x.amax(-1, keepdim=True)).exp_().div_(x.sum(-1, keepdim=True))


class HeldQ:
    """A store of its own: each position's q [B, Vd] float32 (draft columns) kept in a [B, K, Vd]
    tensor sized by the first step it sees (tests and tools, where no runner reads q)."""

    def __init__(self, num_draft: int = 16) -> None:
        self.q: torch.Tensor | None = None  # [B, K, Vd]
        self.num_draft = num_draft

    def distribution(self, logits, temperature, is_greedy, position):
        B, V = logits.shape
        if self.q is None or self.q.shape[0] < B or self.q.shape[2] != V:
            self.q = torch.zeros(B, self.num_draft, V, dtype=torch.float32, device=logits.device)
        q = self.q[:B, position]  # [B, Vd] a view
        q.copy_(logits)
        return softmax_(q.div_(temperature[:, None]))

    def kept(self, batch: int, num_draft: int) -> torch.Tensor:
        return self.q[:batch, :num_draft]
