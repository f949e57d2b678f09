"""One engine step of vLLM 0.34's Model Runner V2, as the drafter sees it (a StepBatch).

The runner hands propose() its InputBatch and the step's device tensors; nothing is read back
from the device here. Host values are the runner's own host arrays (batch layout, prefill state,
the scheduler's computed counts, an upper bound under async scheduling: what text_bound asks
for) and each prompt's visual placeholder spans, recorded once when the request was added
(`PromptLayouts`). Rows of `last_sampled` and `next_prefill_tokens` are request-state slots
(`idx_mapping`), every other tensor is in batch order.

A worked step (K = 3, two requests): request a decodes with 3 drafts, 1 of them accepted; b
runs a 5-token chunk of its prompt, not its last:
    query_start_loc_np  [0, 4, 9]      rows a: 0..3, b: 4..8
    num_rejected        [2, 0]         -> num_valid [2, 5]
    num_sampled         [2, 0]         -> mid_prefill [False, True]
    next_token          [last_sampled[slot a], next_prefill_tokens[0, slot b]]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..drafter import SparrowDrafter, StepBatch


@dataclass
class PromptLayout:
    """Where a prompt's visual placeholders are: runs [start, end) of its token positions."""

    starts: np.ndarray  # [R] int64
    ends: np.ndarray  # [R] int64
    visual: int  # placeholders in the whole prompt

    @classmethod
    def of(cls, prompt: np.ndarray, visual_ids: np.ndarray) -> PromptLayout:
        visual = np.isin(prompt, visual_ids).astype(np.int8)  # [P]
        edges = np.diff(np.concatenate([[0], visual, [0]]))  # +1 where a run starts, -1 past its end
        return cls(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1), int(visual.sum()))

    def visual_in(self, lo: int, hi: int) -> int:
        """Visual placeholders among positions [lo, hi)."""
        return int(np.clip(np.minimum(self.ends, hi) - np.maximum(self.starts, lo), 0, None).sum())


class PromptLayouts:
    """Each live request's PromptLayout, by request id: recorded when the runner adds it, dropped
    when it finishes or leaves the runner (preempted)."""

    def __init__(self, visual_ids: np.ndarray) -> None:
        self.visual_ids, self.by_request = visual_ids, {}

    def record(self, req_id: str, prompt_len: int, token_ids) -> None:
        prompt = np.asarray(token_ids[:prompt_len], dtype=np.int64)
        self.by_request[req_id] = PromptLayout.of(prompt, self.visual_ids)

    def drop(self, req_ids) -> None:
        for r in req_ids:
            self.by_request.pop(r, None)

    def text_bound(self, req_ids: list[str], end: np.ndarray, prompt: np.ndarray) -> np.ndarray:
        """[B] an upper bound on each request's text entries once its first end[b] positions are in:
        end less the visual placeholders before it (all of the prompt's, once past it)."""
        layouts = [self.by_request[r] for r in req_ids]
        bound = end - np.fromiter((x.visual for x in layouts), dtype=np.int64, count=len(req_ids))
        for i in np.flatnonzero(end < prompt):  # mid-prompt: only the placeholders already passed
            bound[i] = end[i] - layouts[i].visual_in(0, int(end[i]))
        return bound

    def text_rows(self, req_ids: list[str], computed: np.ndarray, qlen: np.ndarray, prompt: np.ndarray) -> np.ndarray:
        """[B] rows of the step less the visual placeholders among them (decode rows are all text)."""
        rows = qlen.astype(np.int64)
        for i in np.flatnonzero(computed < prompt):
            lo = int(computed[i])
            rows[i] -= self.by_request[req_ids[i]].visual_in(lo, int(min(lo + qlen[i], prompt[i])))
        return rows


def step_batch(drafter: SparrowDrafter, layouts: PromptLayouts, input_batch, prompt_len_np: np.ndarray,
               hidden: torch.Tensor, num_sampled: torch.Tensor, num_rejected: torch.Tensor,
               last_sampled: torch.Tensor, next_prefill_tokens: torch.Tensor) -> StepBatch:
    """prompt_len_np: [max_num_reqs] host prompt lengths by request-state slot; hidden
    [num_tokens (+ padding), H]; num_sampled, num_rejected [num_reqs]; last_sampled
    [max_num_reqs, 1]; next_prefill_tokens [lookahead, max_num_reqs]."""
    n, T = input_batch.num_reqs, input_batch.num_tokens
    req_ids = list(input_batch.req_ids[:n])
    slots = input_batch.idx_mapping[:n]  # [B] device
    query_start = input_batch.query_start_loc_np[: n + 1].astype(np.int64)  # [B + 1] host
    qsl = input_batch.query_start_loc[: n + 1].long()  # [B + 1] device
    query_lens = qsl[1:] - qsl[:-1]  # [B]
    sampled = num_sampled[:n] > 0  # [B] False: a prompt chunk that is not its last
    prompt = prompt_len_np[input_batch.idx_mapping_np[:n]].astype(np.int64)  # [B] host
    computed = input_batch.num_computed_tokens_np[:n].astype(np.int64)  # [B] host, an upper bound
    qlen = np.diff(query_start)
    decoding = not input_batch.has_prefill
    return StepBatch(
        req_ids=req_ids,
        token_ids=input_batch.input_ids[:T].long(),
        hidden=hidden[:T],
        query_start=query_start,
        num_valid=(query_lens - num_rejected[:n].long()),
        seq_start=(input_batch.seq_lens[:n].long() - query_lens),
        num_prompt_tokens=drafter.to_device(prompt),
        next_token=torch.where(sampled, last_sampled[slots, 0], next_prefill_tokens[0, slots].long()),
        mid_prefill=~sampled,
        decode_only=decoding,
        text_bound=layouts.text_bound(req_ids, computed + qlen, prompt),
        text_rows=None if decoding else layouts.text_rows(req_ids, computed, qlen, prompt),
    )
