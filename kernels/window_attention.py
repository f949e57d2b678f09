"""Triton kernels: paged K/V write and text-anchored window attention (reference: *_ref.py).

One attention launch serves a mixed batch: every query row (prefill of a text run, a decode
token, a chained draft token) is one program per (row, query head) that walks its own key
ranges, the anchors [0, min(A, lo)) and the window [lo, pos] with lo = max(0, pos - W + 1),
through the request's block table, with an online softmax in fp32. The masks are index ranges,
never materialised; freed (out-of-window) pages are never addressed. GQA: query head h reads
kv head h // group.

Simple by design: no query tiling, so a long prefill run is memory-bound on re-reading its keys
per row; the draft's runs are text-only (a prompt's text, then K+1 rows per step), which keeps
that small. Set TRITON_INTERPRET=1 before importing to run on CPU (tests).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _write_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
                     ROW_ELEMS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    slot = tl.load(slot_ptr + row).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    m = offs < ROW_ELEMS  # one row = kv_heads * head_dim contiguous elements
    tl.store(k_cache_ptr + slot * ROW_ELEMS + offs, tl.load(k_ptr + row * ROW_ELEMS + offs, mask=m), mask=m)
    tl.store(v_cache_ptr + slot * ROW_ELEMS + offs, tl.load(v_ptr + row * ROW_ELEMS + offs, mask=m), mask=m)


def write_kv(k_cache, v_cache, slot_mapping, k, v) -> None:
    """Scatter k/v [N, kv_heads, D] into the paged caches [blocks, bs, kv_heads, D] at slots [N]."""
    n = k.shape[0]
    if n == 0:
        return
    row = k.shape[1] * k.shape[2]
    _write_kv_kernel[(n,)](k.to(k_cache.dtype).contiguous(), v.to(v_cache.dtype).contiguous(),
                           k_cache, v_cache, slot_mapping.to(torch.int32).contiguous(),
                           ROW_ELEMS=row, BLOCK=triton.next_power_of_2(row))


@triton.jit
def _attend_range(acc, m_i, l_i, q, k_cache_ptr, v_cache_ptr, table_ptr, start, end, kv_head,
                  BS: tl.constexpr, KV_HEADS: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr):
    """Fold keys [start, end) of one request into the running softmax state."""
    offs_d = tl.arange(0, D)
    for tile in range(start, end, BLOCK_N):
        idx = tile + tl.arange(0, BLOCK_N)  # [BLOCK_N] text indices
        live = idx < end
        page = tl.load(table_ptr + idx // BS, mask=live, other=0).to(tl.int64)
        slot = page * BS + idx % BS
        addr = (slot * KV_HEADS + kv_head)[:, None] * D + offs_d[None, :]  # [BLOCK_N, D]
        k = tl.load(k_cache_ptr + addr, mask=live[:, None], other=0.0).to(tl.float32)
        v = tl.load(v_cache_ptr + addr, mask=live[:, None], other=0.0).to(tl.float32)
        s = tl.sum(k * q[None, :], axis=1)  # [BLOCK_N] (q is pre-scaled)
        s = tl.where(live, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _window_attention_kernel(q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, tables_ptr, row_req_ptr, row_pos_ptr,
                             scale, anchors, window, table_stride,
                             HEADS: tl.constexpr, KV_HEADS: tl.constexpr, D: tl.constexpr,
                             BS: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // (HEADS // KV_HEADS)
    pos = tl.load(row_pos_ptr + row)
    table_ptr = tables_ptr + tl.load(row_req_ptr + row).to(tl.int64) * table_stride
    offs_d = tl.arange(0, D)
    q = tl.load(q_ptr + (row * HEADS + head) * D + offs_d).to(tl.float32) * scale  # [D]
    lo = 0
    if window > 0:
        lo = tl.maximum(pos - window + 1, 0)
    acc = tl.zeros([D], dtype=tl.float32)
    m_i = tl.full([], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([], dtype=tl.float32)
    acc, m_i, l_i = _attend_range(acc, m_i, l_i, q, k_cache_ptr, v_cache_ptr, table_ptr, 0,
                                  tl.minimum(anchors, lo), kv_head, BS, KV_HEADS, D, BLOCK_N)
    acc, m_i, l_i = _attend_range(acc, m_i, l_i, q, k_cache_ptr, v_cache_ptr, table_ptr, lo, pos + 1,
                                  kv_head, BS, KV_HEADS, D, BLOCK_N)
    out = acc / l_i
    tl.store(out_ptr + (row * HEADS + head) * D + offs_d, out.to(out_ptr.dtype.element_ty))


def window_attention(q, k_cache, v_cache, block_tables, row_req, row_pos, anchors: int, window: int,
                     scale: float, block_n: int = 16) -> torch.Tensor:
    """Same contract as window_attention_ref: q [N, H, D] -> [N, H, D]."""
    n, heads, d = q.shape
    out = torch.empty_like(q)
    if n == 0:
        return out
    tables = block_tables.to(torch.int32).contiguous()
    _window_attention_kernel[(n, heads)](
        q.contiguous(), k_cache, v_cache, out, tables, row_req.to(torch.int32).contiguous(),
        row_pos.to(torch.int32).contiguous(), scale, anchors, window, tables.shape[1],
        HEADS=heads, KV_HEADS=k_cache.shape[2], D=d, BS=k_cache.shape[1], BLOCK_N=block_n)
    return out
