"""The sizes the GPU check runs at: a Qwen2.5-VL-7B-shaped target and its one-layer Sparrow
draft on a GPU, and the same code at tiny sizes on CPU (the suite's run).

One dataclass, the single source of every size the check uses; `SEVEN_B` is what a user's
H100/H200 serves with the shipped draft (depth 8; vLLM's defaults there: 1,024 requests, steps of
16,384 tokens for `LLM` and 8,192 for the server, decode graphs for batches up to 256),
`TINY` keeps every part under a minute on 2 CPU cores with the Triton interpreter.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    # The draft's text-anchored window and depth (the shipped draft's).
    anchors: int = 4
    window: int = 512
    k: int = 8
    # Kernels: the layouts serving launches ([B, 1]: the decode commit's last entry and every
    # chained forward), over rings with histories up to `kernel_history` entries (wrapped many
    # times), fresh slots and padding rows; judged in fp32 (IEEE, 1e-5) and in the model's dtype.
    kernel_batches: tuple[int, ...] = (1, 64, 256)
    kernel_history: int = 20_000
    kernel_timing_batches: tuple[int, ...] = (64, 256)
    # Graphs: requests alive at most, steps driven, graph buckets (drafting/graphs.default_buckets).
    graph_requests: int = 256
    graph_steps: int = 48
    # Memory: the drafter as vLLM's GPU defaults size it (max_num_seqs requests, text positions up
    # to the model length), profiled at max_num_batched_tokens, and the steps at that bound.
    max_requests: int = 1024
    max_text_tokens: int = 128_000  # max_model_len: Qwen2.5-VL-7B's default
    step_tokens: int = 16_384  # max_num_batched_tokens (LLM's default; the server's is 8,192)
    tree_topk: int = 4  # the tree search measured (drafting/tree.py): topk children per level
    # Costs: the target's verify step at rows per request `verify_rows` (1 + drafts) for each batch
    # and context; the draft step at depths 1 and k, and one chained forward at `draft_widths`.
    contexts: tuple[int, ...] = (4096, 25_000)
    batches: tuple[int, ...] = (1, 4, 16, 64)
    verify_rows: tuple[int, ...] = (1, 9, 17, 33)
    draft_widths: tuple[int, ...] = (1, 4)
    text_tokens: int = 320  # text entries each request's draft cache holds (the draft never sees visual ones)
    timing_repeats: int = 20
    # Modes: requests of the small batch each mode drafts for, and a reduced vocabulary's size.
    mode_requests: int = 8
    reduced_vocab: int = 32_768

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads


SEVEN_B = CheckShapes(
    name="qwen2.5-vl-7b", hidden=3584, heads=28, kv_heads=4, head_dim=128, intermediate=18_944, vocab=152_064,
    target_layers=28, dtype=torch.bfloat16)

# fp32 only (the Triton interpreter computes bf16 in fp32); a vocabulary big enough that a step's
# logits weigh in its memory as they do at 7B widths.
TINY = CheckShapes(
    name="tiny", hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=96, vocab=2048, target_layers=2,
    dtype=torch.float32, anchors=2, window=12, k=3, kernel_batches=(1, 5, 12), kernel_history=60,
    kernel_timing_batches=(5,), graph_requests=12, graph_steps=30, max_requests=16, max_text_tokens=512,
    step_tokens=64, tree_topk=2, contexts=(64, 256), batches=(1, 4), verify_rows=(1, 4, 7), draft_widths=(1, 2),
    text_tokens=20, timing_repeats=2, mode_requests=3, reduced_vocab=64)
