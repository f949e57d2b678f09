"""Text-anchored window attention over the draft's ring cache (window.py).

One interface, `WindowAttentionBackend.write_and_attend`, called once per draft forward for the
whole batch, with a plain torch implementation that runs on every device (the reference for the
Triton kernels, which plug in behind the same interface on CUDA). Default: triton on CUDA, torch
elsewhere; SPARROW_ATTENTION_BACKEND=torch|triton overrides it (triton off CUDA only under the Triton interpreter, TRITON_INTERPRET=1: tests).
"""

from __future__ import annotations

import os
from typing import Protocol

import torch
from vllm_sparrow_kernels.window_attention_ref import ring_window_attention_ref

from .window import TextWindowCache, WindowBatch


class WindowAttentionBackend(Protocol):
    name: str

    def write_and_attend(
        self,
        cache: TextWindowCache,
        wb: WindowBatch,
        q: torch.Tensor,  # [B, L, heads, head_dim]
        k: torch.Tensor,  # [B, L, kv_heads, head_dim]
        v: torch.Tensor,  # [B, L, kv_heads, head_dim]
    ) -> torch.Tensor:  # [B, L, heads, head_dim]
        """Attend every row to its slot's cached keys and to this forward's earlier rows, then
        store this forward's valid rows in the cache."""
        ...


class TorchWindowAttention:
    """One gather of the batch's slots and one masked SDPA (GQA) for the whole batch: the
    kernels' torch reference, which is also the CPU path."""

    name = "torch"

    def write_and_attend(self, cache, wb, q, k, v):
        return ring_window_attention_ref(
            q, k, v, cache.k, cache.v, wb.slots, wb.pos, wb.valid, wb.cache_len,
            anchors=cache.anchors, window=cache.spec.window or 0, ring=cache.ring, scale=q.shape[-1] ** -0.5)


class TritonWindowAttention:
    """kernels/window_attention.py: one launch per draft forward, one program per
    (request, kv head, query tile) so the query heads of a group share their key reads; the
    cache write is folded into the attention launch when each request fits one query tile
    (every decode and chained forward), and is a second launch otherwise."""

    name = "triton"

    def __init__(self) -> None:
        from vllm_sparrow_kernels import window_attention as kernels

        self.kernels = kernels

    def write_and_attend(self, cache, wb, q, k, v):
        return self.kernels.ring_window_attention(
            q, k, v, cache.k, cache.v, wb.slots, wb.pos, wb.valid, wb.cache_len,
            anchors=cache.anchors, window=cache.spec.window or 0, ring=cache.ring,
            scale=q.shape[-1] ** -0.5)


def select_backend(device: torch.device) -> WindowAttentionBackend:
    choice = os.environ.get("SPARROW_ATTENTION_BACKEND", "").strip().lower()
    if choice not in ("", "torch", "triton"):
        raise ValueError(
            f"SPARROW_ATTENTION_BACKEND={choice!r}: use 'torch' or 'triton' (or leave it unset)"
        )
    if choice == "" and torch.device(device).type == "cuda":
        choice = "triton"
    if choice == "triton":
        if torch.device(device).type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(
                "SPARROW_ATTENTION_BACKEND=triton needs a CUDA device (or TRITON_INTERPRET=1 to run "
                "the kernels slowly on CPU); unset it to use the torch path."
            )
        return TritonWindowAttention()
    return TorchWindowAttention()
