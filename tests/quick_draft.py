"""A Sparrow draft that accepts something on a tiny random target, made in seconds.

Tiny random targets fall into repetitive greedy continuations; a draft distilled on those
continuations learns them, so speculative tests exercise accepted tokens, not only rejections.
"""

from __future__ import annotations

import random
from pathlib import Path

from vllm_sparrow.checkpoint import init_draft, load_draft, save_draft
from vllm_sparrow.training.target_runner import HFTarget
from vllm_sparrow.training.text_distill import DistillConfig, distill, greedy_streams


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
