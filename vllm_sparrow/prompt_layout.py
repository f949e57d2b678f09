"""Where each live request's prompt has its visual placeholders, recorded once per request: what
both glues' step translation (v1_runner/proposer.py, v2_runner/step_inputs.py) bounds a step's
text entries and text rows with, from host values only (the drafter skips visual positions, so a
video chunk's placeholders take no draft rows and a request's text entries are its positions less
the placeholders before them).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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
