"""Text-anchored window attention over the draft's ring cache (window.py).

One interface, `WindowAttentionBackend` (store_packed on steps with prompt chunks, commit, then
chain), called once per draft forward for the whole batch, with a plain torch implementation that runs on every device (the reference for the
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
from vllm_sparrow_kernels.window_attention_ref import key_visible, ring_stored_index, ring_write_ref, write_packed_rows

from . import envs
from .window import PackedRows, TextWindowCache, WindowBatch


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

    def store(
        self,
        cache: TextWindowCache,
        wb: WindowBatch,
        k: torch.Tensor,  # [B, L, kv_heads, head_dim]
        v: torch.Tensor,  # [B, L, kv_heads, head_dim]
    ) -> None:
        """Store a fixed layout's valid rows before its last entries are committed (a decode
        step's accepted rows but the last): one scatter, no attention, no host read."""
        ...

    def store_packed(
        self,
        cache: TextWindowCache,
        rows: PackedRows,
        k: torch.Tensor,  # [N, kv_heads, head_dim]
        v: torch.Tensor,  # [N, kv_heads, head_dim]
    ) -> None:
        """Store the real rows of a packed step (prompt chunks beside decodes) that a later query
        can read, before the step's last entries are committed: one scatter, no attention."""
        ...

    def chain(self, cache: TextWindowCache, ctx: Any, wb: WindowBatch, q, k, v) -> torch.Tensor:
        """One chained forward (L = 1, entries past the committed end: scratch that no later
        step reads) after commit(); same shapes."""
        ...


@dataclass
class _StepKeys:
    """Every key a step's forwards read (torch path), gathered once per step.

    Columns: the slots' S <= A + R rows (those that can hold entries) as they were before the step, the commit's L rows, then
    C = K - 1 columns the chained forwards fill in turn. A ring row the commit overwrote keeps
    its old entry here, which no chained query can see: it is R = W + K indices older than the
    entry that replaced it, so outside every later window.
    """

    keys: torch.Tensor  # [B, kv_heads, S + L + C, D]
    values: torch.Tensor  # [B, kv_heads, S + L + C, D]
    mask: torch.Tensor  # [B, 1, C, S + L + C] keys visible to chained query c (text index committed + c)
    col0: int  # column of chained entry 0 (S + L)
    step: int = 0  # chained forwards done


class TorchWindowAttention:
    """One gather of the batch's slots per step and one masked SDPA (GQA) per forward.

    commit() computes what the kernels' torch reference computes (one gather, one SDPA, the
    same ring write) and keeps the gathered keys, with room for the chained entries, so a chained
    forward writes its key into that buffer and attends with a mask built once per step: no
    cache write, gather or mask rebuild per chained forward (the Triton path writes its chained
    entries into the cache's scratch rows instead; no later step reads them)."""

    name = "torch"

    def commit(self, cache, wb, q, k, v):
        B, L = wb.pos.shape
        A, W, C = cache.anchors, cache.spec.window or 0, cache.lookahead - 1
        dt = q.dtype
        rows = cache.capacity if wb.rows is None else min(wb.rows, cache.capacity)  # S: rows that can hold entries
        kc, vc = cache.k[:, :, :rows].index_select(0, wb.slots), cache.v[:, :, :rows].index_select(0, wb.slots)  # [B, kv, S, D], before writing
        pad = kc.new_zeros(B, kc.shape[1], C, kc.shape[3])  # the chained entries' columns
        keys = torch.cat([kc, k.transpose(1, 2).to(kc.dtype), pad], 2)  # [B, kv, S + L + C, D]
        values = torch.cat([vc, v.transpose(1, 2).to(vc.dtype), pad], 2)
        if keys.dtype != dt:  # the cache's dtype; computed in the model's
            keys, values = keys.to(dt), values.to(dt)
        chain_pos = (wb.cache_len + wb.valid.sum(1))[:, None] + torch.arange(C, device=wb.pos.device)  # [B, C]
        key_idx = torch.cat([ring_stored_index(wb.cache_len, A, cache.ring, rows), torch.where(wb.valid, wb.pos, -1),
                             chain_pos], 1)  # [B, S + L + C]
        mask = key_visible(key_idx, torch.cat([wb.pos, chain_pos], 1), A, W)[:, None]  # [B, 1, L + C, S + L + C]
        # Padding rows read every key (all finite), so their discarded softmax is never empty.
        commit_mask = mask[:, :, :L] | ~wb.valid[:, None, :, None]
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=commit_mask,
                                             scale=q.shape[-1] ** -0.5, enable_gqa=q.shape[2] != k.shape[2])
        ring_write_ref(cache.k, cache.v, wb.slots, wb.pos, wb.valid, k, v, A, cache.ring)
        return out.transpose(1, 2), _StepKeys(keys, values, mask[:, :, L:], kc.shape[2] + L)

    def store(self, cache, wb, k, v):
        ring_write_ref(cache.k, cache.v, wb.slots, wb.pos, wb.valid, k, v, cache.anchors, cache.ring)

    def store_packed(self, cache, rows, k, v):
        write_packed_rows(cache.k, cache.v, k, v, rows.slots, rows.cu, rows.cache_len, rows.count, cache.anchors,
                          cache.ring)

    def chain(self, cache, ctx, wb, q, k, v):
        col, s = ctx.col0 + ctx.step, ctx.step
        ctx.keys[:, :, col] = k[:, 0]  # [B, kv, D]
        ctx.values[:, :, col] = v[:, 0]
        ctx.step += 1
        out = F.scaled_dot_product_attention(q.transpose(1, 2), ctx.keys, ctx.values,
                                             attn_mask=ctx.mask[:, :, s : s + 1], scale=q.shape[-1] ** -0.5,
                                             enable_gqa=q.shape[2] != k.shape[2])  # [B, heads, 1, D]
        return out.transpose(1, 2)


class TritonWindowAttention:
    """kernels/window_attention.py for the fixed layouts (decode and chained forwards): one
    launch per draft forward, one program per (request, kv head, query tile) so the query heads
    of a group share their key reads, the cache write folded into the attention launch; chained
    forwards write their scratch entries into the cache and read them back from there. Packed
    steps store their rows with the same torch scatter as the torch path (a scatter is what a
    kernel would do too) and commit their last entries through the kernel."""

    name = "triton"

    def __init__(self) -> None:
        from vllm_sparrow_kernels import window_attention

        self.kernels = window_attention

    def commit(self, cache, wb, q, k, v):
        return self._attend(cache, wb, q, k, v), None

    def store(self, cache, wb, k, v):  # a scatter: torch's is what a kernel would do
        ring_write_ref(cache.k, cache.v, wb.slots, wb.pos, wb.valid, k, v, cache.anchors, cache.ring)

    def store_packed(self, cache, rows, k, v):  # a scatter: torch's is what a kernel would do
        write_packed_rows(cache.k, cache.v, k, v, rows.slots, rows.cu, rows.cache_len, rows.count, cache.anchors,
                          cache.ring)

    def chain(self, cache, ctx, wb, q, k, v):
        return self._attend(cache, wb, q, k, v)

    def _attend(self, cache, wb, q, k, v):
        return self.kernels.ring_window_attention(
            q, k, v, cache.k, cache.v, wb.slots, wb.pos, wb.valid, wb.cache_len,
            anchors=cache.anchors, window=cache.spec.window or 0, ring=cache.ring,
            scale=q.shape[-1] ** -0.5)


def select_backend(device: torch.device) -> WindowAttentionBackend:
    choice = envs.SPARROW_ATTENTION_BACKEND  # None, "torch" or "triton"
    if choice is None:
        choice = "triton" if torch.device(device).type == "cuda" else "torch"
    if choice == "triton":
        if torch.device(device).type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(
                "SPARROW_ATTENTION_BACKEND=triton needs a CUDA device (or TRITON_INTERPRET=1 to run "
                "the kernels slowly on CPU); unset it to use the torch path."
            )
        return TritonWindowAttention()
    return TorchWindowAttention()
