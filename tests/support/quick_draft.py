"""A Sparrow draft that accepts something on a tiny random target, made in seconds.

Tiny random targets fall into repetitive greedy continuations; a draft distilled on those
continuations learns them, so speculative tests exercise accepted tokens, not only rejections.
The distillation is a capture-free shortcut over the training pipeline: the target (`HFTarget`)
answers each text-only prompt greedily, and the draft trains on the stage-1 objective of
`objective.py` (same window mask, same losses as `sparrow train`) over those streams.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch

from vllm_sparrow.checkpoint import init_draft, load_draft, save_draft
from vllm_sparrow.model import SparrowDraftModel
from vllm_sparrow.training.objective import unrolled_stages
from vllm_sparrow.training.target_runner import HFTarget


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


def make_trained_draft(target_dir: str | Path, out_dir: str | Path, *, steps: int = 200,
                       prompts: list[list[int]] | None = None, num_prompts: int = 12,
                       max_new_tokens: int = 48, seed: int = 0,
                       anchor_tokens: int = 4, window_tokens: int | None = 64) -> Path:
    init_draft(target_dir, out_dir, anchor_tokens=anchor_tokens, window_tokens=window_tokens, seed=seed)
    draft = load_draft(out_dir)
    target = HFTarget(str(target_dir))
    vocab = target.spec.vocab_size
    rnd = random.Random(seed)
    if prompts is None:
        prompts = [[rnd.randrange(3, min(vocab, 300)) for _ in range(rnd.randrange(4, 12))]
                   for _ in range(num_prompts)]
    streams = greedy_streams(target, prompts, max_new_tokens)
    distill(draft, target, streams, DistillConfig(steps=steps, seed=seed))
    return save_draft(draft, out_dir)
