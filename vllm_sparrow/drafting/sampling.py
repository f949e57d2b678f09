"""How a draft token is chosen at each chained position, and where a sampled draft's distribution
is kept for vLLM's rejection sampler.

    greedy    the argmax: a point-mass draft, which vLLM verifies exactly at any temperature
    Sampled   drawn from q_b = softmax(logits_b / T_b) per request (a greedy request, T_b below
              GREEDY_TEMPERATURE, drafts its argmax); q goes to a store, position by position

A sampled draft is lossless only if the rejection sampler is told the very q it was drawn from,
and q is a [vocab] row per drafted token: at vLLM's GPU defaults (1,024 requests, K = 8, a
152,064-token vocabulary) a [B, K, vocab] float32 tensor is 5 GB. So q is never stacked here:
each position's q is made inside the storage vLLM reads, and the token is drawn from that.

    QBuffer    vLLM 0.32/0.33 (Model Runner V1): the runner takes q as [B, K, vocab] float32 after
               propose() (take_last_draft_probs). One buffer [max_requests, K, vocab] allocated
               once, when the draft loads (so vLLM's memory profile counts it, unlike vLLM's own
               EAGLE, whose stacked probabilities are made per step outside the profile); each
               position's q is computed in place in its [B, vocab] slice.
    LogitRows  vLLM 0.34 (Model Runner V2): the runner keeps pre-temperature draft logits in its
               own cache [max_num_reqs, K, vocab] in the LM head's dtype (vLLM's allocation) and
               verifies with softmax(stored / T). The logits are rounded into the request's row
               first and the token is drawn from softmax(rounded / T): with a bf16 head, q from the
               unrounded logits would differ from the verifier's by up to ~1% per token.
A step's transient memory is a few [B, vocab] rows (the logits, their float copy, the race's
noise), which the drafter's profile_step runs at the engine's largest batch.
"""

from __future__ import annotations

from typing import Protocol

import torch

GREEDY_TEMPERATURE = 1e-5  # vLLM's threshold: a request at a lower temperature is greedy


class Sampler(Protocol):
    def __call__(self, logits: torch.Tensor, position: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """logits [B, Vd] of chained position `position` -> (token columns [B], q [B, Vd] float32
        the columns were drawn from, or None: a deterministic draft)."""


def greedy(logits: torch.Tensor, position: int = 0) -> tuple[torch.Tensor, None]:
    return logits.argmax(dim=-1), None


class QStore(Protocol):
    """Where a sampled draft's distribution is kept for verification (one per engine)."""

    def distribution(self, logits: torch.Tensor, temperature: torch.Tensor, is_greedy: torch.Tensor,
                     position: int) -> torch.Tensor:
        """Record position `position`'s draft distribution of logits [B, Vd] (draft columns) at
        temperature [B] and return q [B, Vd] float32: exactly what the verifier will read."""


class Sampled:
    """The sampled draft: row b drawn from q_b, which `store` keeps for vLLM's rejection sampler.
    temperature: [>= B] per request (batch order)."""

    def __init__(self, temperature: torch.Tensor, generator: torch.Generator, store: QStore) -> None:
        self.temperature, self.generator, self.store = temperature, generator, store

    def __call__(self, logits: torch.Tensor, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        temp = self.temperature[: logits.shape[0]].float()  # [B]
        is_greedy = temp < GREEDY_TEMPERATURE
        argmax = logits.argmax(-1)  # [B] before the store may reuse the logits' memory
        q = self.store.distribution(logits, torch.where(is_greedy, 1.0, temp), is_greedy, position)  # [B, Vd]
        # Exponential race: argmax(q / E), E ~ Exp(1), is a draw from q, without torch.multinomial's
        # host-side checks; the noise buffer becomes q / E in place (one [B, Vd] temporary).
        race = torch.empty_like(q).exponential_(generator=self.generator)
        ids = torch.where(is_greedy, argmax, race.reciprocal_().mul_(q).argmax(-1))  # [B]
        one_hot_rows(q, is_greedy, argmax)
        return ids, q

    def kept(self, batch: int, num_draft: int) -> torch.Tensor | None:
        """The step's q [B, K, vocab] where the store is a QBuffer (a view), else None (kept elsewhere)."""
        return self.store.view(batch, num_draft) if isinstance(self.store, QBuffer) else None


def sampled(temperature: torch.Tensor, generator: torch.Generator, store: QStore | None = None) -> Sampled:
    """A Sampled draft; without a store, q is kept in a QBuffer made for this batch (tests)."""
    return Sampled(temperature, generator, store if store is not None else GrowingQBuffer())


def one_hot_rows(q: torch.Tensor, rows: torch.Tensor, ids: torch.Tensor) -> None:
    """Set q's rows where `rows` [B] to one-hot at ids [B], in place, without a host read: a greedy
    request's draft is a point mass."""
    q.mul_((~rows)[:, None].to(q.dtype))
    q.scatter_add_(1, ids[:, None], rows[:, None].to(q.dtype))


def softmax_(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dimension of a float tensor, in place (no [B, vocab] copy)."""
    return x.sub_(x.amax(-1, keepdim=True)).exp_().div_(x.sum(-1, keepdim=True))


class QBuffer:
    """q of every sampled draft of a step, as vLLM's V1 runner takes it: [max_requests, K, vocab]
    float32, allocated once. Columns outside a reduced draft vocabulary (`columns`: draft column
    -> token id) stay zero: q = 0 there, which rejection sampling handles like any q."""

    def __init__(self, max_requests: int, num_draft: int, vocab_size: int, device, columns=None) -> None:
        self.q = torch.zeros(max_requests, num_draft, vocab_size, dtype=torch.float32, device=device)
        self.columns = columns  # [Vd] or None (full vocabulary)

    @staticmethod
    def bytes_needed(max_requests: int, num_draft: int, vocab_size: int) -> int:
        return 4 * max_requests * num_draft * vocab_size

    def distribution(self, logits, temperature, is_greedy, position):
        B = logits.shape[0]
        if self.columns is None:  # computed in place in the step's slice
            if logits.shape[-1] != self.q.shape[-1]:
                raise ValueError(f"draft logits have {logits.shape[-1]} columns, the q buffer {self.q.shape[-1]}: "
                                 "size it by the vocabulary the draft's LM head produces")
            q = self.q[:B, position]  # [B, vocab] a view
            q.copy_(logits)
            return softmax_(q.div_(temperature[:, None]))
        q = softmax_(logits.to(torch.float32, copy=True).div_(temperature[:, None]))  # [B, Vd]
        self.q[:B, position].index_copy_(1, self.columns, q)
        return q

    def view(self, batch: int, num_draft: int) -> torch.Tensor:
        """[B, K, vocab]: the step's q for the runner (a view: no copy)."""
        return self.q[:batch, :num_draft]


class GrowingQBuffer(QBuffer):
    """A QBuffer sized by the first step it sees (tests and tools, where no engine sizes it)."""

    def __init__(self, num_draft: int = 16) -> None:
        self.q, self.columns, self.num_draft = None, None, num_draft

    def distribution(self, logits, temperature, is_greedy, position):
        B, V = logits.shape
        if self.q is None or self.q.shape[0] < B or self.q.shape[2] != V:
            self.q = torch.zeros(B, self.num_draft, V, dtype=torch.float32, device=logits.device)
        return super().distribution(logits, temperature, is_greedy, position)


class LogitRows:
    """vLLM 0.34's draft-logits cache as the store: values [rows, K, vocab] in the head's dtype,
    pre-temperature; `rows` [>= B] the requests' rows in batch order (their request-state slots),
    `columns` a reduced vocabulary's token ids (the other columns are written -inf: q = 0 there)."""

    def __init__(self, values: torch.Tensor, rows: torch.Tensor, columns=None) -> None:
        self.values, self.rows, self.columns = values, rows, columns

    def distribution(self, logits, temperature, is_greedy, position):
        stored = logits.to(self.values.dtype)  # [B, Vd] the values the verifier will read
        rows = self.rows[: stored.shape[0]]  # [B]
        if self.columns is None:
            self.values[rows, position] = stored
        else:
            full = stored.new_full((stored.shape[0], self.values.shape[-1]), float("-inf"))
            self.values[rows, position] = full.index_copy_(1, self.columns, stored)
        return softmax_(stored.to(torch.float32, copy=True).div_(temperature[:, None]))  # the caller's logits untouched
