"""What the check's parts run on: a random-weight Sparrow draft at the check's shapes, the
target's embedding and LM head as random tables, and engine steps built as vLLM's runner hands
them to the drafter (StepBatch): text prompts prefilled, decode steps of K + 1 rows per request
with a random number accepted, prompt chunks (text or mostly visual) joining decodes.

Random weights are enough here: the check compares paths of the same arithmetic (kernel against
reference, graphs against eager) and measures time and memory, none of which depends on what
the weights learned.
"""

from __future__ import annotations

import random

import torch

from ..attention import WindowAttentionBackend
from ..config import SparrowConfig
from ..drafting.step import StepBatch
from ..drafter import SparrowDrafter
from ..model import SparrowDraftModel, seeded_draft
from .shapes import CheckShapes


class RandomTokenIO:
    """The target's token embedding and LM head, random: embed [vocab, hidden], head [vocab, hidden]."""

    def __init__(self, s: CheckShapes, device: torch.device, dtype: torch.dtype, seed: int = 1) -> None:
        g = torch.Generator(device=device).manual_seed(seed)
        self.table = torch.randn(s.vocab, s.hidden, generator=g, device=device).to(dtype)
        self.head = (torch.randn(s.vocab, s.hidden, generator=g, device=device) * s.hidden ** -0.5).to(dtype)

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


def make_drafter(s: CheckShapes, model: SparrowDraftModel, io: RandomTokenIO, backend: WindowAttentionBackend,
                 device: torch.device, dtype: torch.dtype, max_requests: int, max_text_tokens: int) -> SparrowDrafter:
    return SparrowDrafter(model, io, (visual_token(s),), backend, device, dtype, max_requests=max_requests,
                          max_draft_tokens=s.k, max_text_tokens=max_text_tokens)


def visual_token(s: CheckShapes) -> int:
    """The id the check's prompts use as the visual placeholder (the draft skips it)."""
    return s.vocab - 1


class Requests:
    """Requests as the engine sees them: sequence length, prompt length, next token and the
    drafts of the last step; builds each step's StepBatch (on the device, host lists beside)."""

    def __init__(self, s: CheckShapes, device: torch.device, dtype: torch.dtype, seed: int) -> None:
        self.s, self.device, self.dtype = s, device, dtype
        self.rnd = random.Random(seed)
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self.live: dict[str, dict] = {}

    def join(self, rid: str, prompt: int, text: int | None = None) -> None:
        """A request whose prompt of `prompt` tokens holds `text` text tokens (the rest visual)."""
        self.live[rid] = dict(seq=0, prompt=prompt, text=prompt if text is None else text, next=None, drafts=[])

    def step(self, rids: list[str]) -> StepBatch:
        """One engine step of `rids`: a new request sends its whole prompt, a decoding one its
        next token and last drafts, of which a random number were accepted."""
        s, rnd = self.s, self.rnd
        toks, rows_per, valid, seq, prompt, nxt = [], [], [], [], [], []
        for rid in rids:
            r = self.live[rid]
            if r["seq"] == 0:
                rows = self._prompt_tokens(r["prompt"], r["text"])
                nv = len(rows)
            else:
                rows = [r["next"]] + (r["drafts"] or [rnd.randrange(s.vocab - 1) for _ in range(s.k)])
                nv = rnd.randrange(1, len(rows) + 1)
            rows_per.append(len(rows))
            toks += rows
            valid.append(nv)
            seq.append(r["seq"])
            prompt.append(r["prompt"])
            r["seq"] += nv
            r["next"] = rnd.randrange(s.vocab - 1)
            nxt.append(r["next"])
        starts = [sum(rows_per[:i]) for i in range(len(rows_per))]
        hidden = torch.randn(len(toks), s.hidden, generator=self.gen, device=self.device).to(self.dtype)
        t = lambda xs: torch.tensor(xs, dtype=torch.long, device=self.device)  # noqa: E731
        return StepBatch.from_lists(rids, t(toks), hidden, starts, valid, seq, prompt, t(nxt), [False] * len(rids),
                                    visual_token_ids=(visual_token(s),))

    def took(self, rids: list[str], drafts: torch.Tensor) -> None:
        """Remember each request's drafts [B, K] (the next step verifies them)."""
        for rid, row in zip(rids, drafts.tolist()):
            self.live[rid]["drafts"] = row

    def _prompt_tokens(self, n: int, text: int) -> list[int]:
        """n prompt tokens: two text tokens, the visual run (n - text placeholders), the rest text."""
        vis = visual_token(self.s)
        words = [self.rnd.randrange(vis) for _ in range(text)]
        return words[:2] + [vis] * (n - text) + words[2:]
