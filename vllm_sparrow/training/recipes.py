"""Draft kinds as peers: what each kind trains on, how it is built, validated and exported.

The training loop (train.py) is the same for every kind; a recipe supplies the kind's parts:
  sparrow  text positions only, IVSB visual states, MTP stages over the text stream (the paper)
  eagle    EAGLE-1-style baseline: every position's final target state (vLLM's `eagle`)
  eagle3   EAGLE-3 baseline: fused auxiliary target states of every position, training-time
           test over its own outputs for K steps, no state regression (vLLM's `eagle3`)
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import torch

from .acceptance import AcceptanceEstimate, estimate_acceptance, estimate_acceptance_full_stream
from .depth import replay_depth
from .objective import StageResult, unrolled_stages


class Recipe(Protocol):
    kind: str
    capture_flag: str | None  # the capture setting whose states this kind trains on (None: every capture)

    def init(self, cfg, target_dir: str, path: Path) -> None:
        """Write a randomly initialised draft for the target to `path`."""

    def load(self, path: Path, cfg) -> torch.nn.Module: ...

    def stages(self, cfg, draft, target, bridge, sample, gen, show_visual: bool) -> list[StageResult]:
        """The loss terms of one captured sample (stage 0, then the chained stages)."""

    def validate(self, cfg, draft, target, samples) -> AcceptanceEstimate: ...

    def save(self, draft, out_dir: Path, cfg) -> Path:
        """Export the draft in the format vLLM serves it in."""


def _scored(cfg, n: int, first_response: int, device) -> torch.Tensor:
    """[n] entries whose label x[t+2] counts: response tokens unless loss_on_prompt."""
    if cfg.loss_on_prompt:
        return torch.ones(n, dtype=torch.bool, device=device)
    return torch.arange(n, device=device) + 2 >= first_response


class SparrowRecipe:
    kind = "sparrow"
    capture_flag = None

    def init(self, cfg, target_dir, path):
        from ..checkpoint import init_draft

        init_draft(target_dir, path, anchor_tokens=cfg.anchor_tokens, window_tokens=cfg.window_tokens,
                   seed=cfg.seed)

    def load(self, path, cfg):
        from ..checkpoint import load_draft

        draft = load_draft(path, device=cfg.device)
        if cfg.speculative_tokens is not None:  # else the depth is chosen after validation (train.py)
            draft.cfg.speculative_tokens = cfg.speculative_tokens
        return draft

    def stages(self, cfg, draft, target, bridge, sample, gen, show_visual):
        from .ivsb import visual_inputs

        is_visual = sample["is_visual"]
        dev = next(draft.parameters()).device
        tokens = sample["token_ids"][~is_visual].to(dev)  # [m] the text stream
        hidden = sample["text_hidden"].to(dev, torch.float32)  # [m, H]
        prompt_text = int((~is_visual[: int(sample["prompt_len"])]).sum())
        scored = _scored(cfg, tokens.shape[0] - 2, prompt_text, dev)
        visual = visual_inputs(cfg, draft, bridge, sample, gen, show_visual)
        return unrolled_stages(draft, target, tokens, hidden, scored, cfg.mtp_steps, cfg.hidden_loss_weight, visual)

    def validate(self, cfg, draft, target, samples):
        return estimate_acceptance(draft, target, samples, replay_depth(cfg.speculative_tokens))

    def save(self, draft, out_dir, cfg):
        from ..checkpoint import save_draft

        return save_draft(draft, out_dir)


class EagleRecipe:
    kind = "eagle"
    capture_flag = "eagle_baseline"

    def init(self, cfg, target_dir, path):
        from transformers import AutoConfig

        from .eagle_baseline import init_eagle_baseline

        init_eagle_baseline(AutoConfig.from_pretrained(target_dir), seed=cfg.seed).save(path)

    def load(self, path, cfg):
        from .eagle_baseline import EagleBaselineDraft

        return EagleBaselineDraft.load(path).to(cfg.device)

    def stages(self, cfg, draft, target, bridge, sample, gen, show_visual):
        """Every position (visual ones included) at its vLLM rotary position."""
        from .eagle_baseline import full_stream

        dev = next(draft.parameters()).device
        tokens, hidden, positions = full_stream(sample)  # [n], [n, H], [n]
        scored = _scored(cfg, tokens.shape[0] - 2, int(sample["prompt_len"]), dev)
        return unrolled_stages(draft, target, tokens.to(dev), hidden.to(dev), scored, cfg.mtp_steps,
                               cfg.hidden_loss_weight, rope_positions=positions.to(dev))

    def validate(self, cfg, draft, target, samples):
        return estimate_acceptance_full_stream(draft, target, samples, replay_depth(cfg.speculative_tokens))

    def save(self, draft, out_dir, cfg):
        return draft.save(out_dir)


class _Eagle3TokenIO:
    """The target's embedding, the EAGLE-3 draft's own LM head."""

    def __init__(self, draft, target) -> None:
        self.draft, self.target = draft, target

    def embed(self, ids):
        return self.target.embed(ids)

    def logits(self, y):
        return self.draft.logits(y)


class Eagle3Recipe:
    kind = "eagle3"
    capture_flag = "eagle3"

    def init(self, cfg, target_dir, path):
        from .eagle3 import init_eagle3

        init_eagle3(target_dir, seed=cfg.seed).save(path)

    def load(self, path, cfg):
        from .eagle3 import Eagle3Draft

        draft = Eagle3Draft.load(path).to(cfg.device)
        if draft.cfg.draft_vocab is not None:
            raise ValueError("training an EAGLE-3 draft over a reduced vocabulary is not supported yet; "
                             "export one with a full vocabulary")
        return draft

    def _stream(self, sample, dev):
        """Token ids [n], rotary positions [n] (the ones the V1 runner gives the draft: M-RoPE's
        temporal row), auxiliary states [n, A * H]."""
        if "aux_hidden" not in sample:
            raise ValueError("this capture has no EAGLE-3 states; capture with --eagle3")
        n = sample["token_ids"].shape[0]
        positions = sample["positions"] if "positions" in sample else torch.arange(n)
        return sample["token_ids"].to(dev), positions.to(dev), sample["aux_hidden"].to(dev, torch.float32)

    def stages(self, cfg, draft, target, bridge, sample, gen, show_visual):
        """Training-time test: stage 0 reads the fused target states, stage s the draft's own
        outputs of stage s - 1 (what serving feeds back), no state regression."""
        dev = next(draft.parameters()).device
        tokens, positions, aux = self._stream(sample, dev)
        scored = _scored(cfg, tokens.shape[0] - 2, int(sample["prompt_len"]), dev)
        return unrolled_stages(draft, _Eagle3TokenIO(draft, target), tokens, draft.fuse(aux), scored,
                               cfg.mtp_steps, 0.0, rope_positions=positions)

    def validate(self, cfg, draft, target, samples):
        from .acceptance import estimate_acceptance_eagle3

        return estimate_acceptance_eagle3(draft, _Eagle3TokenIO(draft, target), target, samples,
                                          replay_depth(cfg.speculative_tokens), self._stream)

    def save(self, draft, out_dir, cfg):
        return draft.save(out_dir)


RECIPES: dict[str, Recipe] = {r.kind: r for r in (SparrowRecipe(), EagleRecipe(), Eagle3Recipe())}


def recipe_for(kind: str) -> Recipe:
    if kind not in RECIPES:
        raise ValueError(f"draft_kind must be one of {', '.join(RECIPES)}, got {kind!r}")
    return RECIPES[kind]
