"""Distil a Sparrow draft from a target on its own greedy text continuations (stage-1 loss).

A small, capture-free shortcut over the training pipeline for tests and demos: the target
(`HFTarget`) answers each text-only prompt greedily, and the draft trains on the stage-1
objective of `objective.py` (same window mask, same losses as `sparrow train`) over those streams.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..model import SparrowDraftModel
from .objective import unrolled_stages


@dataclass
class DistillConfig:
    steps: int = 300
    lr: float = 3e-3
    hidden_loss_weight: float = 0.1
    seed: int = 0


@torch.no_grad()
def greedy_streams(target, prompts: list[list[int]], max_new_tokens: int):
    """(token ids [n], final hidden [n, H]) of each text-only prompt + the target's greedy answer."""
    streams = []
    for ids in prompts:
        inputs = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)}
        answer = target.answer(inputs, max_new_tokens)
        tokens, final, *_ = target.states(inputs, answer, 1)
        streams.append((tokens.clone(), final.clone()))
    return streams


def distill(draft: SparrowDraftModel, io, streams, cfg: DistillConfig) -> list[float]:
    """Train in place; returns the loss per step."""
    torch.manual_seed(cfg.seed)
    params = [p for n, p in draft.named_parameters() if not n.startswith(("embed_tokens", "lm_head"))]
    opt = torch.optim.AdamW(params, lr=cfg.lr)
    draft.train()
    losses = []
    for step in range(cfg.steps):
        tokens, hidden = streams[step % len(streams)]
        scored = torch.ones(tokens.shape[0] - 2, dtype=torch.bool)
        loss = unrolled_stages(draft, io, tokens, hidden, scored, 0, cfg.hidden_loss_weight)[0].loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    draft.eval()
    return losses
