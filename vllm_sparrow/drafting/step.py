"""One draft step as named stages, and the interface every drafting strategy drafts through.

    StepBatch ── strategy.step(drafter, ...) ── drafter.commit ──> Committed ── strategy.draft ──> Drafts

A runner's glue (v1_runner/, v2_runner/) turns its runner's step into a StepBatch and hands it,
with the drafter, to the drafting strategy chosen once (the peers of this folder, choice.py); the
drafter (drafter.py) owns the request slots and the text-window cache and commits each step's
target states; the strategy drafts K tokens per request from what the commit left. The strategies
sit above the drafter and import nothing of it: what a strategy may use of the drafter is
DraftCore (and DecodeCore, the decode graphs'), the public surface SparrowDrafter implements;
what a glue may ask of a strategy is DraftingStrategy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import numpy as np
import torch

from ..window import TextWindowCache, WindowBatch
from .sampling import Sampler, greedy

__all__ = ["Attention", "Committed", "DecodeCore", "DraftCore", "Drafts", "DraftingStrategy", "Plain", "Proposal",
           "Sampler", "StepBatch", "greedy"]


@dataclass
class StepBatch:
    """What the target computed in one engine step, for each request of the batch."""

    req_ids: list[str]  # [B]
    token_ids: torch.Tensor  # [T] tokens the target processed this step
    hidden: torch.Tensor  # [T, hidden] target final-layer (normed) hidden states of those tokens
    query_start: np.ndarray  # [B + 1] host: request b owns rows query_start[b]:query_start[b+1]
    num_valid: torch.Tensor  # [B] rows whose states count (rejected draft rows excluded)
    seq_start: torch.Tensor  # [B] sequence index of the request's first row
    num_prompt_tokens: torch.Tensor  # [B] only prompt positions can be visual placeholders
    next_token: torch.Tensor  # [B] the token after the last valid row
    mid_prefill: torch.Tensor  # [B] bool: prompt not fully processed yet: commit, no drafts
    # Host promise that no row is a prompt position (so none is visual, none mid-prefill, no
    # request restarts): every request is decoding. Such steps take the fixed-shape decode path.
    decode_only: bool = False
    # Host: an upper bound on each request's text entries after this step (its sequence length
    # will do; less its visual placeholders is tight). Lets the torch path skip unused ring rows.
    text_bound: np.ndarray | None = None  # [B]
    # Host: an upper bound on each request's text rows in this step (its rows less the visual
    # placeholders among them). Sizes the packed layout of a step with prompt chunks without a
    # device read; None: every row may be text (a video chunk's placeholders become padding).
    text_rows: np.ndarray | None = None  # [B]

    @classmethod
    def from_lists(cls, req_ids: list[str], token_ids: torch.Tensor, hidden: torch.Tensor,
                   row_start: Sequence[int], num_valid: Sequence[int], seq_start: Sequence[int],
                   num_prompt_tokens: Sequence[int], next_token: torch.Tensor,
                   mid_prefill: Sequence[bool], visual_token_ids: Sequence[int] | None = None) -> StepBatch:
        """Host-side construction (tests, the acceptance replay): rows of request b start at
        row_start[b] and run to the next request's start (the last one to the end). With
        visual_token_ids, text_rows is counted from the tokens (tight); else left unbounded."""
        dev = token_ids.device
        t = lambda xs, dt: torch.tensor(list(xs), dtype=dt, device=dev)  # noqa: E731
        decode_only = all(s >= p for s, p in zip(seq_start, num_prompt_tokens)) and not any(mid_prefill)
        query_start = np.asarray(list(row_start) + [token_ids.shape[0]], dtype=np.int64)
        text_rows = None
        if visual_token_ids is not None:
            ids, qs = token_ids.cpu().numpy(), query_start
            seq = np.concatenate([s + np.arange(e - b) for s, b, e in zip(seq_start, qs[:-1], qs[1:])] or [[]])
            prompt = np.repeat(np.asarray(num_prompt_tokens), np.diff(qs))
            text = ~(np.isin(ids, list(visual_token_ids)) & (seq < prompt))  # [T]
            text_rows = np.array([text[lo:hi].sum() for lo, hi in zip(qs[:-1], qs[1:])], dtype=np.int64)
        return cls(list(req_ids), token_ids.long(), hidden, query_start,
                   t(num_valid, torch.long), t(seq_start, torch.long), t(num_prompt_tokens, torch.long),
                   next_token.long(), t(mid_prefill, torch.bool), decode_only,
                   np.asarray(seq_start, dtype=np.int64) + np.diff(query_start), text_rows)

    def decode_width(self) -> int | None:
        """L of the fixed [B, L] layout of a step where every request decodes: its longest
        request's rows (1 + the drafts it verifies); None when some row is a prompt position."""
        return int(np.diff(self.query_start).max(initial=1)) if self.decode_only else None

    def fits_decode_layout(self, num_draft: int) -> bool:
        """Every request decodes with at most num_draft + 1 rows: the fixed [B, K + 1] layout
        (what CUDA graphs capture) holds the step."""
        width = self.decode_width()
        return width is not None and width <= num_draft + 1


@dataclass
class Committed:
    """What a step's commit leaves for drafting."""

    state: torch.Tensor  # [B, H] draft output at each request's last committed entry (drafts the 1st token)
    slots: torch.Tensor  # [B] cache slot of each request
    committed: torch.Tensor  # [B] text entries in the slot after the commit; chained ones take c, c + 1, ...
    drafting: torch.Tensor  # [B] bool: requests that draft this step (the others get zeros)
    chain_ctx: Any  # the attention backend's context for the chained forwards (attention.py)
    rows: int | None = None  # ring rows that can hold an entry (None: every row)


@dataclass
class Drafts:
    """A step's drafts."""

    ids: torch.Tensor  # [B, K] draft token ids (0 for requests that do not draft)
    sampled: bool = False  # drawn from q (rejection sampling verifies each against it), not a point mass
    # [B, K, vocab] the distribution each id was drawn from, where the sampler keeps it as vLLM's V1
    # runner takes it (a view of its QBuffer: drafting/sampling.py); None otherwise
    probs: torch.Tensor | None = None
    confidence: torch.Tensor | None = None  # [B, K] each id's probability under the draft (adaptive length)


@dataclass
class Proposal:
    """One chained position's draft tokens."""

    ids: torch.Tensor  # [B] token ids (vocabulary ids, a reduced draft vocabulary mapped back)
    sampled: bool  # drawn from a distribution the sampler's store keeps (not a point mass)
    confidence: torch.Tensor | None  # [B] their probability under the draft (when asked)


Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # (q, k, v) -> out


class DraftCore(Protocol):
    """What drafting strategies use of the drafter (drafter.SparrowDrafter implements it)."""

    io: Any  # the token I/O: embed(ids), logits(states) (model.TokenIO)
    cache: TextWindowCache
    vocab_ids: torch.Tensor | None  # [N] column -> token id of a reduced draft vocabulary

    def commit(self, batch: StepBatch, num_draft: int) -> Committed: ...

    def forward(self, hidden: torch.Tensor, tokens: torch.Tensor, wb: WindowBatch,
                attention: Attention) -> torch.Tensor: ...

    def chain_attention(self, committed: Committed, wb: WindowBatch) -> Attention: ...

    def propose(self, y: torch.Tensor, sample: Sampler, confidence: bool = False, position: int = 0) -> Proposal: ...

    def slots_for(self, req_ids: Sequence[str]) -> list[int]: ...


class DecodeCore(DraftCore, Protocol):
    """What the decode step's CUDA graphs (graphs.py) use of the drafter besides DraftCore: the
    fixed [B, L] commit of a decode step on static buffers."""

    device: torch.device
    dtype: torch.dtype  # of the draft's states
    hidden_size: int

    def decode_indices(self, batch: StepBatch, slot_list: list[int], L: int) -> tuple[torch.Tensor, torch.Tensor]:
        """([B] slots, [T] destination row b * L + u of each of the batch's rows)."""

    def commit_rows(self, slots: torch.Tensor, hid: torch.Tensor, tok: torch.Tensor, nv: torch.Tensor,
                    seq_start: torch.Tensor, next_token: torch.Tensor, rows: int | None = None) -> Committed: ...

class DraftingStrategy(Protocol):
    """A drafting peer. Each answers for itself what a glue needs to know of it, so a glue never
    asks which peer it holds."""

    name: str

    def step(self, drafter: DraftCore, batch: StepBatch, num_draft: int, sample: Sampler) -> Drafts:
        """Commit the batch's target states and draft num_draft tokens per request (in inference
        mode: what a glue calls each engine step)."""

    def draft(self, drafter: DraftCore, committed: Committed, num_draft: int, sample: Sampler) -> Drafts:
        """Draft num_draft tokens per request from a commit (what step() does after committing;
        the drafter's profile_step runs it at the engine's largest step)."""

    def per_request(self, drafts: Drafts) -> list[list[int]] | None:
        """The drafts cut to each request's own length (adaptive length: host lists, as vLLM's
        V1 runner takes them), or None: every request verifies all K."""

    def capture(self) -> None:
        """Capture the strategy's CUDA graphs (when the draft loads, before vLLM profiles memory); nothing for most."""

    def describe(self) -> dict:
        """What it is, for the load log and the engine's stats: {"drafting": name, "tree":
        [topk, budget] or None, "decode_steps": "eager" | "on static buffers" | "in CUDA graphs"}."""


class Plain:
    """The answers of a strategy without per-request lengths or graphs (a base of the peers), and
    the step they share: commit, then draft."""

    @torch.inference_mode()
    def step(self, drafter: DraftCore, batch: StepBatch, num_draft: int, sample: Sampler = greedy) -> Drafts:
        return self.draft(drafter, drafter.commit(batch, num_draft), num_draft, sample)

    def per_request(self, drafts: Drafts) -> list[list[int]] | None:
        return None

    def capture(self) -> None:
        pass

    def describe(self) -> dict:
        return {"drafting": self.name, "tree": None, "decode_steps": "eager"}
