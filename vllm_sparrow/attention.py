"""Text-anchored window attention over the paged text-only cache.

One interface, `WindowAttentionBackend.write_and_attend`, with a plain torch implementation
that runs on every device (the reference for the Triton kernels, which plug in behind the same
interface on CUDA). Default: triton on CUDA, torch elsewhere; SPARROW_ATTENTION_BACKEND=torch|triton
overrides it (triton off CUDA only under the Triton interpreter, TRITON_INTERPRET=1: tests).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from .window import TextKVCache, WindowSpec


@dataclass(frozen=True)
class Segment:
    """Consecutive query rows of one request, at text indices q_lo .. q_hi-1."""

    req_id: str
    q_lo: int
    q_hi: int

    @property
    def length(self) -> int:
        return self.q_hi - self.q_lo


class WindowAttentionBackend(Protocol):
    name: str

    def write_and_attend(
        self,
        cache: TextKVCache,
        spec: WindowSpec,
        segments: list[Segment],
        q: torch.Tensor,  # [N, heads, head_dim], rows ordered by segment
        k: torch.Tensor,  # [N, kv_heads, head_dim]
        v: torch.Tensor,  # [N, kv_heads, head_dim]
    ) -> torch.Tensor:  # [N, heads, head_dim]
        ...


class TorchWindowAttention:
    """Gathers each request's window from the pages and runs masked SDPA per request."""

    name = "torch"

    def write_and_attend(self, cache, spec, segments, q, k, v):
        slots = torch.cat([cache.slots(s.req_id, torch.arange(s.q_lo, s.q_hi)) for s in segments])
        cache.write(slots, k, v)
        out = torch.empty_like(q)
        row = 0
        group = q.shape[1] // k.shape[1]
        for s in segments:
            k_idx = spec.key_indices(s.q_lo, s.q_hi)  # [L]
            keys, values = cache.read(cache.slots(s.req_id, k_idx))  # [L, kv_heads, head_dim]
            q_idx = torch.arange(s.q_lo, s.q_hi)
            mask = spec.mask(q_idx, k_idx).to(q.device)  # [n, L]
            if s.length == 1 and bool(mask.all()):
                mask = None  # a decode step sees every gathered key: SDPA's unmasked path is faster
            qs = q[row : row + s.length].transpose(0, 1)  # [heads, n, head_dim]
            ks = keys.to(q.dtype).transpose(0, 1)  # [kv_heads, L, head_dim]
            vs = values.to(q.dtype).transpose(0, 1)
            o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, enable_gqa=group > 1)  # [heads, n, head_dim]
            out[row : row + s.length] = o.transpose(0, 1)
            row += s.length
        return out


class TritonWindowAttention:
    """The fused kernels of kernels/window_attention.py: one write launch, one attention launch
    for the whole mixed batch (prefill runs, decode rows and chained draft rows alike)."""

    name = "triton"

    def __init__(self) -> None:
        from vllm_sparrow_kernels import window_attention as kernels

        self.kernels = kernels

    def write_and_attend(self, cache, spec, segments, q, k, v):
        segments = [s for s in segments if s.length]
        if not segments:
            return torch.empty_like(q)
        dev = q.device
        slots = torch.cat([cache.slots(s.req_id, torch.arange(s.q_lo, s.q_hi)) for s in segments])
        self.kernels.write_kv(cache.k, cache.v, slots.to(dev), k, v)
        tables = [cache.tables[s.req_id] for s in segments]
        width = max(len(t) for t in tables)
        block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)  # [R, width]
        row_req = torch.cat([torch.full((s.length,), i) for i, s in enumerate(segments)])  # [N]
        row_pos = torch.cat([torch.arange(s.q_lo, s.q_hi) for s in segments])  # [N]
        out = self.kernels.window_attention(
            q, cache.k, cache.v, block_tables.to(dev), row_req.to(dev), row_pos.to(dev),
            spec.anchors, spec.window or 0, q.shape[-1] ** -0.5)
        return out


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
