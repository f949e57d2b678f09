"""Text-anchored window attention over the draft's ring cache (window.py).

One interface, `WindowAttentionBackend` (commit, then chain), called once per draft forward for
the whole batch, with a plain torch implementation that runs on every device (the reference for the
Triton kernels, which plug in behind the same interface on CUDA). Default: triton on CUDA, torch
elsewhere; SPARROW_ATTENTION_BACKEND=torch|triton overrides it (triton off CUDA only under the
Triton interpreter, TRITON_INTERPRET=1: tests).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from vllm_sparrow_kernels.window_attention_ref import key_visible, ring_stored_index, ring_window_attention_ref

from .window import TextWindowCache, WindowBatch


class WindowAttentionBackend(Protocol):
    """Attention of the draft's forwards of one step: commit() for the first (the step's new
    entries, stored in the cache), then chain() for each chained draft forward."""

    name: str

    def commit(
        self,
        cache: TextWindowCache,
        wb: WindowBatch,
        q: torch.Tensor,  # [B, L, heads, head_dim]
        k: torch.Tensor,  # [B, L, kv_heads, head_dim]
        v: torch.Tensor,  # [B, L, kv_heads, head_dim]
    ) -> tuple[torch.Tensor, Any]:  # out [B, L, heads, head_dim], context for chain()
        """Attend every row to its slot's cached keys and to this forward's earlier rows, then
        store this forward's valid rows in the cache."""
        ...

    def chain(self, cache: TextWindowCache, ctx: Any, wb: WindowBatch, q, k, v) -> torch.Tensor:
        """One chained forward (L = 1, entries past the committed end: scratch that no later
        step reads) after commit(); same shapes."""
        ...


@dataclass
class _ChainKeys:
    """The keys a step's forwards read, gathered once per step (torch path)."""

    keys: torch.Tensor  # [B, kv_heads, S, D]
    values: torch.Tensor  # [B, kv_heads, S, D]
    index: torch.Tensor  # [B, S] text index of each key (-1: none)


class TorchWindowAttention:
    """Two gathers of the batch's slots per step and one masked SDPA (GQA) per forward.

    commit() is the kernels' torch reference itself. The chained forwards read the slots as
    commit() left them plus the chain's own entries, so they append their keys to one gather of
    the slots instead of writing scratch rows into the cache and gathering again per forward
    (the Triton path writes them; no later step reads them)."""

    name = "torch"

    def commit(self, cache, wb, q, k, v):
        window = cache.spec.window or 0
        out = ring_window_attention_ref(
            q, k, v, cache.k, cache.v, wb.slots, wb.pos, wb.valid, wb.cache_len,
            anchors=cache.anchors, window=window, ring=cache.ring, scale=q.shape[-1] ** -0.5)
        # The slots as the chain reads them: every entry committed so far, this step's included.
        kc, vc = cache.k.index_select(0, wb.slots), cache.v.index_select(0, wb.slots)  # [B, kv, A + R, D]
        committed = wb.cache_len + wb.valid.sum(1)  # [B]
        return out, _ChainKeys(kc, vc, ring_stored_index(committed, cache.anchors, cache.ring))

    def chain(self, cache, ctx, wb, q, k, v):
        if ctx.keys.dtype != q.dtype:  # the cache's dtype; computed in the model's
            ctx.keys, ctx.values = ctx.keys.to(q.dtype), ctx.values.to(q.dtype)
        ctx.keys = torch.cat([ctx.keys, k.transpose(1, 2)], 2)  # [B, kv, S + 1, D]
        ctx.values = torch.cat([ctx.values, v.transpose(1, 2)], 2)
        ctx.index = torch.cat([ctx.index, wb.pos], 1)  # [B, S + 1]
        mask = key_visible(ctx.index, wb.pos, cache.anchors, cache.spec.window or 0)[:, None]  # [B, 1, 1, S + 1]
        out = F.scaled_dot_product_attention(q.transpose(1, 2), ctx.keys, ctx.values, attn_mask=mask,
                                             enable_gqa=q.shape[2] != k.shape[2])  # [B, heads, 1, D]
        return out.transpose(1, 2)


class TritonWindowAttention:
    """kernels/window_attention.py: one launch per draft forward, one program per
    (request, kv head, query tile) so the query heads of a group share their key reads; the
    cache write is folded into the attention launch when each request fits one query tile
    (every decode and chained forward), and is a second launch otherwise. Chained forwards
    write their scratch entries into the cache and read them back from there."""

    name = "triton"

    def __init__(self) -> None:
        from vllm_sparrow_kernels import window_attention as kernels

        self.kernels = kernels

    def commit(self, cache, wb, q, k, v):
        return self._attend(cache, wb, q, k, v), None

    def chain(self, cache, ctx, wb, q, k, v):
        return self._attend(cache, wb, q, k, v)

    def _attend(self, cache, wb, q, k, v):
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
