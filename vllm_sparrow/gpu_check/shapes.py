"""The sizes the GPU check runs at: a Qwen2.5-VL-7B-shaped target and its one-layer Sparrow
draft on a GPU, and the same code at tiny sizes on CPU (the suite's run).

One dataclass, the single source of every size the check uses; `SEVEN_B` is what a user's
H100/H200 serves (vLLM's defaults there: 1,024 requests, 8,192-token steps for the server),
`TINY` keeps every part under a minute on 2 CPU cores with the Triton interpreter.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class CheckShapes:
    name: str
    # The target (Qwen2.5-VL-7B's language model) and the draft layer share these widths.
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    target_layers: int
    dtype: torch.dtype
    # The draft's text-anchored window and depth.
    anchors: int = 4
    window: int = 512
    k: int = 3
    # Timing: target contexts (tokens in each request's KV cache: mostly visual), batch sizes,
    # and the text tokens each request's draft cache holds (the draft never sees visual ones).
    contexts: tuple[int, ...] = (4096, 25_000)
    batches: tuple[int, ...] = (1, 16, 64)
    text_tokens: int = 320
    # Graph lockstep: requests alive at most, steps driven, graph buckets.
    graph_requests: int = 64
    graph_steps: int = 60
    graph_buckets: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 48, 64)
    # Memory: the drafter as vLLM's GPU defaults size it, and the mixed steps measured on it:
    # (decoding requests, prompt-chunk rows, text rows among the chunk's).
    max_requests: int = 1024
    max_text_tokens: int = 128_000  # max_model_len: Qwen2.5-VL-7B's default
    step_tokens: int = 8192  # max_num_batched_tokens (the server's default)
    mixed_steps: tuple[tuple[int, int, int], ...] = ((255, 8192 - 255 * 4, 600), (64, 3000, 3000))
    # Kernel cases: (batch, rows per request L, cached entries per request before the step).
    kernel_cases: tuple[tuple[int, int, int], ...] = ((1, 1, 300), (16, 4, 2000), (64, 4, 700), (64, 9, 40))
    timing_repeats: int = 20
    extra: dict = field(default_factory=dict)

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads


SEVEN_B = CheckShapes(
    name="qwen2.5-vl-7b", hidden=3584, heads=28, kv_heads=4, head_dim=128, intermediate=18_944, vocab=152_064,
    target_layers=28, dtype=torch.bfloat16)

TINY = CheckShapes(
    name="tiny", hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=96, vocab=300, target_layers=2,
    dtype=torch.float32, anchors=2, window=12, k=3, contexts=(64, 256), batches=(1, 4), text_tokens=20,
    graph_requests=6, graph_steps=24, graph_buckets=(1, 2, 4, 8), max_requests=16, max_text_tokens=512, step_tokens=64,
    mixed_steps=((5, 40, 12), (3, 30, 30)), kernel_cases=((1, 1, 5), (3, 4, 30), (2, 9, 0)), timing_repeats=2)
