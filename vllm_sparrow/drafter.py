"""Sparrow drafting: hidden-state reuse over a text-only, window-attended draft cache.

Independent of vLLM: the glue (proposer.py) turns each engine step into a `StepBatch` and asks
for K draft tokens per request.

Per request the drafter keeps a text stream. Entry j pairs the target's hidden state of the
j-th text token with the embedding of the text token that follows it (EAGLE-style: "state at
t + token t+1 -> state at t+1"); visual placeholder positions are skipped entirely, so a
video's 25k tokens add nothing to the draft's cache or its per-step work. Entries built from
the target's states are committed; the K-1 entries the draft builds from its own states while
chaining are written past the committed end and overwritten by the next step.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import torch

from .attention import Segment, WindowAttentionBackend
from .model import SparrowDraftModel, TokenIO
from .window import TextKVCache, WindowSpec

# sample(logits [R, vocab], batch_rows [R]) -> (token ids [R], probs [R, vocab] or None).
# probs are the distribution the ids were drawn from (None: deterministic, e.g. greedy).
Sampler = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]]


@dataclass
class StepBatch:
    """What the target computed in one engine step, for each request of the batch."""

    req_ids: list[str]  # [B]
    token_ids: torch.Tensor  # [T] tokens the target processed this step
    hidden: torch.Tensor  # [T, hidden] target final-layer (normed) hidden states of those tokens
    row_start: list[int]  # [B] first row of each request in token_ids / hidden
    num_valid: list[int]  # [B] rows whose states count (rejected draft rows excluded)
    seq_start: list[int]  # [B] sequence index of the request's first row
    num_prompt_tokens: list[int]  # [B] only prompt positions can be visual placeholders
    next_token: torch.Tensor  # [B] the token after the last valid row
    mid_prefill: list[bool]  # [B] prompt not fully processed yet: update the cache, no drafts


@dataclass
class _RequestState:
    seen: int = 0  # sequence index up to which target states were consumed
    committed: int = 0  # committed text entries in the draft cache
    pending: torch.Tensor | None = None  # [hidden] last text state still waiting for its next token


class SparrowDrafter:
    def __init__(
        self,
        model: SparrowDraftModel,
        io: TokenIO,
        visual_token_ids: tuple[int, ...],
        backend: WindowAttentionBackend,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        cfg = model.cfg
        self.model, self.io, self.backend = model, io, backend
        self.spec = WindowSpec(cfg.anchor_tokens, cfg.window_tokens)
        self.cache = TextKVCache(
            cfg.num_key_value_heads, cfg.head_dim, cfg.cache_block_size, dtype, device
        )
        self.visual_ids = torch.tensor(sorted(visual_token_ids), dtype=torch.long, device=device)
        self.states: dict[str, _RequestState] = {}
        # Largest draft-cache footprint each recent request reached (bytes), for metrics/tests.
        self.peak_request_bytes: OrderedDict[str, int] = OrderedDict()

    # ---- request lifecycle ---------------------------------------------------------
    def release(self, req_ids) -> None:
        """Forget requests that finished, were aborted or preempted (their blocks go back)."""
        for r in req_ids:
            self.states.pop(r, None)
            self.cache.release(r)

    def _state(self, req_id: str, seq_start: int) -> _RequestState:
        st = self.states.get(req_id)
        if st is None or st.seen != seq_start:
            # New request, recompute after preemption, or a prefix-cache hit whose states we
            # never saw: start the text stream afresh from here. RoPE is relative, so starting
            # the count at 0 loses only the context the draft did not see.
            self.release([req_id])
            st = self.states[req_id] = _RequestState(seen=seq_start)
        return st

    # ---- one engine step -----------------------------------------------------------
    @torch.inference_mode()
    def step(
        self, batch: StepBatch, num_draft: int, sample: Sampler
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Commit this step's target states, then draft `num_draft` tokens per request.

        Returns draft ids [B, num_draft] and, when `sample` is probabilistic, the draft
        probabilities [B, num_draft, vocab] the ids were drawn from.
        """
        hidden_parts, token_parts, segments, drafting = [], [], [], []
        for i, req_id in enumerate(batch.req_ids):
            h, toks = self._commit_entries(batch, i)
            st = self.states[req_id]
            if h.shape[0]:
                segments.append(Segment(req_id, st.committed - h.shape[0], st.committed))
                hidden_parts.append(h)
                token_parts.append(toks)
                if not batch.mid_prefill[i]:
                    drafting.append((i, len(segments) - 1))
            self.cache.reserve(req_id, st.committed + max(num_draft - 1, 0))

        B = len(batch.req_ids)
        draft_ids = torch.zeros(B, num_draft, dtype=torch.long, device=batch.next_token.device)
        if not segments:
            self._after_step(batch.req_ids)
            return draft_ids, None
        y = self._forward(torch.cat(hidden_parts), torch.cat(token_parts), segments)
        ends = torch.tensor([s.length for s in segments], device=y.device).cumsum(0) - 1
        rows = torch.tensor([i for i, _ in drafting], dtype=torch.long, device=y.device)
        probs_out = None
        if drafting and num_draft > 0:
            last = y[ends[[seg for _, seg in drafting]]]  # [R, hidden]
            draft_ids[rows], probs_out = self._chain(last, [segments[s] for _, s in drafting], rows, num_draft, sample, B)
        self._after_step(batch.req_ids)
        return draft_ids, probs_out

    def _after_step(self, req_ids: list[str]) -> None:
        for req_id in req_ids:
            used = self.cache.bytes_in_use(req_id)
            self.cache.trim(req_id, self.spec, self.states[req_id].committed)
            peak = max(used, self.peak_request_bytes.pop(req_id, 0))
            self.peak_request_bytes[req_id] = peak
        while len(self.peak_request_bytes) > 4096:
            self.peak_request_bytes.popitem(last=False)

    def _commit_entries(self, batch: StepBatch, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This step's committed entries of request i: (hidden [n, H], following token [n])."""
        st = self._state(batch.req_ids[i], batch.seq_start[i])
        lo, n = batch.row_start[i], batch.num_valid[i]
        toks = batch.token_ids[lo : lo + n]
        seq = torch.arange(batch.seq_start[i], batch.seq_start[i] + n, device=toks.device)
        visual = torch.isin(toks, self.visual_ids) & (seq < batch.num_prompt_tokens[i])
        text_rows = lo + torch.nonzero(~visual).flatten()  # [m]
        items = batch.hidden[text_rows]  # [m, H]
        following = batch.token_ids[text_rows]  # token of each text row
        if st.pending is not None:
            items = torch.cat([st.pending[None], items])
        else:
            following = following[1:]
        if not batch.mid_prefill[i]:
            following = torch.cat([following, batch.next_token[i : i + 1].to(following.dtype)])
        count = min(following.shape[0], items.shape[0])
        st.pending = items[count].clone() if count < items.shape[0] else None
        st.committed += count
        st.seen = batch.seq_start[i] + n
        return items[:count], following[:count]

    def _forward(self, hidden, tokens, segments: list[Segment]) -> torch.Tensor:
        """Run the draft layer on entries (rows ordered by segment); returns [N, hidden]."""
        positions = torch.cat([torch.arange(s.q_lo, s.q_hi) for s in segments]).to(hidden.device)

        def attend(q, k, v):
            return self.backend.write_and_attend(self.cache, self.spec, segments, q, k, v)

        embeds = self.io.embed(tokens)
        return self.model(hidden.to(embeds.dtype), embeds, positions, attend)

    def _chain(self, last, segs, rows, num_draft, sample, B):
        """Autoregressive drafting from each request's last committed entry."""
        ids, probs = [], []
        y = last  # [R, hidden]
        for step in range(num_draft):
            tok, p = sample(self.io.logits(y), rows)
            ids.append(tok)
            if p is not None:
                probs.append(p)
            if step == num_draft - 1:
                break
            spec_segments = [Segment(s.req_id, s.q_hi + step, s.q_hi + step + 1) for s in segs]
            y = self._forward(y, tok, spec_segments)
        out_ids = torch.stack(ids, dim=1)  # [R, K]
        if not probs:
            return out_ids, None
        full = torch.zeros(B, num_draft, probs[0].shape[-1], dtype=probs[0].dtype, device=last.device)
        full[rows] = torch.stack(probs, dim=1)
        return out_ids, full

    # ---- accounting ----------------------------------------------------------------
    def stats(self) -> dict:
        return {
            "live_requests": sorted(self.states),
            "blocks_in_use": self.cache.blocks_in_use(),
            "pool_blocks": self.cache.num_blocks,
            "bytes_per_block": self.cache.bytes_per_block(),
            "peak_request_bytes": dict(self.peak_request_bytes),
        }
