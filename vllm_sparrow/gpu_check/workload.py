"""What the check's parts run on: a random-weight Sparrow draft at the check's shapes, the target's
embedding and LM head as random tables, and engine steps built as vLLM's runner hands them to the
drafter (StepBatch): text prompts prefilled, decode steps of K + 1 rows per request with a random
number accepted, prompt chunks (text or mostly visual) joining decodes.

Random weights are enough here: the check compares paths of the same arithmetic (kernel against
reference, graphs against eager) and measures time and memory, none of which depends on what
the weights learned. On the meta device (memory at 7B shapes without allocating it) tensors
have shapes and no values: nothing is drawn and nothing is read back.
"""

from __future__ import annotations

import random

import numpy as np
import torch

from ..attention import WindowAttentionBackend
from ..config import SparrowConfig
from ..drafting.step import StepBatch
from ..drafter import SparrowDrafter
from ..model import SparrowDraftModel, seeded_draft
from .shapes import CheckShapes


def generator(device: torch.device, seed: int) -> torch.Generator | None:
    """A seeded generator on the device (None on meta, where nothing is drawn)."""
    if torch.device(device).type == "meta":
        return None
    return torch.Generator(device=device).manual_seed(seed)


def randn(*shape, generator, device, dtype) -> torch.Tensor:
    return torch.randn(*shape, generator=generator, device=device).to(dtype)


class RandomTokenIO:
    """The target's token embedding and LM head, random: embed [vocab, hidden], head [vocab, hidden]."""

    def __init__(self, s: CheckShapes, device: torch.device, dtype: torch.dtype, seed: int = 1) -> None:
        g = generator(device, seed)
        self.table = randn(s.vocab, s.hidden, generator=g, device=device, dtype=dtype)
        self.head = (randn(s.vocab, s.hidden, generator=g, device=device, dtype=torch.float32)
                     * s.hidden ** -0.5).to(dtype)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:  # [N] -> [N, hidden]
        return self.table[ids]

    def logits(self, h: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, vocab]
        return h.to(self.head.dtype) @ self.head.T


def draft_config(s: CheckShapes) -> SparrowConfig:
    return SparrowConfig(hidden_size=s.hidden, num_attention_heads=s.heads, num_key_value_heads=s.kv_heads,
                         head_dim=s.head_dim, intermediate_size=s.intermediate, vocab_size=s.vocab,
                         anchor_tokens=s.anchors, window_tokens=s.window, speculative_tokens=s.k)


def random_draft(s: CheckShapes, device: torch.device, dtype: torch.dtype) -> SparrowDraftModel:
    with torch.device(device):  # drawn where it runs: a 7B-wide layer is ~233M weights
        model = seeded_draft(SparrowDraftModel, draft_config(s), seed=0, std=0.02)
    return model.to(dtype).eval()


def make_drafter(s: CheckShapes, model: SparrowDraftModel, io, backend: WindowAttentionBackend,
                 device: torch.device, dtype: torch.dtype, max_requests: int, max_text_tokens: int,
                 num_draft: int | None = None) -> SparrowDrafter:
    return SparrowDrafter(model, io, (visual_token(s),), backend, device, dtype, max_requests=max_requests,
                          max_draft_tokens=num_draft or s.k, max_text_tokens=max_text_tokens)


def visual_token(s: CheckShapes) -> int:
    """The id the check's prompts use as the visual placeholder (the draft skips it)."""
    return s.vocab - 1


class Requests:
    """Requests as the engine sees them: sequence length, prompt length, next token and the
    drafts of the last step; builds each step's StepBatch (on the device, host lists beside)."""

    def __init__(self, s: CheckShapes, device: torch.device, dtype: torch.dtype, seed: int, k: int | None = None) -> None:
        self.s, self.device, self.dtype, self.k = s, device, dtype, k or s.k
        self.rnd = random.Random(seed)
        self.gen = generator(device, seed)
        self.live: dict[str, dict] = {}

    def join(self, rid: str, prompt: int, text: int | None = None) -> None:
        """A request whose prompt of `prompt` tokens holds `text` text tokens (the rest visual)."""
        self.live[rid] = dict(seq=0, prompt=prompt, text=prompt if text is None else text, next=None, drafts=[])

    def leave(self, rid: str) -> None:
        del self.live[rid]

    def decoding(self) -> list[str]:
        return [r for r, v in self.live.items() if v["seq"] > 0]

    def step(self, rids: list[str], accept_all: bool = False) -> StepBatch:
        """One engine step of `rids`: a new request sends its whole prompt, a decoding one its
        next token and last drafts, of which a random number (all with accept_all) were accepted.
        Built from host values only, as the runners' glues build it (no device read: meta works)."""
        s, rnd = self.s, self.rnd
        toks, rows_per, text_rows, valid, seq, prompt, nxt = [], [], [], [], [], [], []
        for rid in rids:
            r = self.live[rid]
            if r["seq"] == 0:
                rows = self._prompt_tokens(r["prompt"], r["text"])
                nv, text = len(rows), r["text"]
            else:
                rows = [r["next"]] + (r["drafts"] or [rnd.randrange(s.vocab - 1) for _ in range(self.k)])
                nv, text = (len(rows) if accept_all else rnd.randrange(1, len(rows) + 1)), len(rows)
            rows_per.append(len(rows))
            text_rows.append(text)
            toks += rows
            valid.append(nv)
            seq.append(r["seq"])
            prompt.append(r["prompt"])
            r["seq"] += nv
            r["next"] = rnd.randrange(s.vocab - 1)
            nxt.append(r["next"])
        qs = np.concatenate([[0], np.cumsum(rows_per)]).astype(np.int64)
        hidden = randn(len(toks), s.hidden, generator=self.gen, device=self.device, dtype=self.dtype)
        t = lambda xs, dt=torch.long: torch.tensor(xs, dtype=dt, device=self.device)  # noqa: E731
        decode_only = all(q >= p for q, p in zip(seq, prompt))
        return StepBatch(list(rids), t(toks), hidden, qs, t(valid), t(seq), t(prompt), t(nxt),
                         t([False] * len(rids), torch.bool), decode_only,
                         np.asarray(seq, dtype=np.int64) + np.diff(qs), np.asarray(text_rows, dtype=np.int64))

    def took(self, rids: list[str], drafts: torch.Tensor) -> None:
        """Remember each request's drafts [B, K] (the next step verifies them)."""
        for rid, row in zip(rids, drafts.tolist()):
            self.live[rid]["drafts"] = row

    def _prompt_tokens(self, n: int, text: int) -> list[int]:
        """n prompt tokens: two text tokens, the visual run (n - text placeholders), the rest text."""
        vis = visual_token(self.s)
        words = [self.rnd.randrange(vis) for _ in range(text)]
        return words[:2] + [vis] * (n - text) + words[2:]
