"""Triton kernel: window attention over packed rows (prompt chunks beside decodes).

Same contract as packed_window_attention_ref.packed_window_attention_ref (read its docstring for
the layout and the tiles). One program per (query tile, kv head): the tile's rows times the kv
head's query-head group form one [BLOCK_M, D] query block. Keys come in three loops with one
online softmax (fp32 accumulation, dot products in the input dtype: tensor cores for fp16/bf16):
the slot's A + R cache rows, the request's in-step anchors left of the band, and the band of at
most BLOCK_L + W - 1 rows, so a tile's work is bounded by the window whatever the chunk's length.
Offsets are int64 (N rows x heads x D passes 2^31 at a few hundred thousand rows).

The cache write (anchors and the last R real rows of each request) is a torch scatter after
the launch (packed_window_attention_ref.write_packed_rows): every tile must have read the cache first.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from .packed_window_attention_ref import packed_tiles, to_device, write_packed_rows
from .window_attention import fold_cache_rows, fold_key_tile


@triton.jit
def _packed_attention_kernel(
        q_ptr, k_ptr, v_ptr, kc_ptr, vc_ptr, out_ptr, slots_ptr, cu_ptr, cache_len_ptr, count_ptr,
        tile_req_ptr, tile_r0_ptr, scale, anchors, window, ring,
        HEADS: tl.constexpr, KV_HEADS: tl.constexpr, D: tl.constexpr, CAP: tl.constexpr,
        GROUP: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_N: tl.constexpr,
        IEEE: tl.constexpr):
    tile = tl.program_id(0)
    kvh = tl.program_id(1)
    b = tl.load(tile_req_ptr + tile)
    r0 = tl.load(tile_r0_ptr + tile)
    start = tl.load(cu_ptr + b).to(tl.int64)
    n = (tl.load(cu_ptr + b + 1) - start).to(tl.int32)  # rows of the request
    c0 = tl.load(cache_len_ptr + b)
    cnt = tl.load(count_ptr + b)  # real rows (keys)
    BLOCK_M: tl.constexpr = BLOCK_L * BLOCK_G
    offs_m = tl.arange(0, BLOCK_M)
    t = r0 + offs_m // BLOCK_G  # query row within the request
    g = offs_m % BLOCK_G
    row_ok = (t < n) & (g < GROUP)
    head = kvh * GROUP + g
    offs_d = tl.arange(0, D)
    p = c0 + t  # query text index
    q_addr = ((start + t) * HEADS + head)[:, None] * D + offs_d[None, :]  # int64
    q = tl.load(q_ptr + q_addr, mask=row_ok[:, None], other=0.0)
    q = (q.to(tl.float32) * scale).to(q_ptr.dtype.element_ty)  # [BLOCK_M, D]
    slot = tl.load(slots_ptr + b).to(tl.int64)
    last = c0 - 1
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)

    # 1. the slot's cached rows
    cache_base = (slot * KV_HEADS + kvh) * CAP
    acc, m_i, l_i = fold_cache_rows(acc, m_i, l_i, q, kc_ptr, vc_ptr, cache_base, last, p, anchors, window, ring,
                                    D, CAP, BLOCK_N, IEEE)

    # 2. this forward's rows: the band [lo, r0 + BLOCK_L) and, left of it, the in-step anchors
    lo = tl.where(window > 0, tl.maximum(r0 - window + 1, 0), 0)
    hi = tl.minimum(r0 + BLOCK_L, n)
    n_anchor = tl.minimum(tl.maximum(anchors - c0, 0), lo)  # in-step rows at text index < A
    for u0 in range(0, n_anchor, BLOCK_N):
        u = u0 + tl.arange(0, BLOCK_N)
        in_range = u < n_anchor
        ok = (in_range & (u < cnt))[None, :] & ((c0 + u)[None, :] <= p[:, None])
        addr = ((start + u) * KV_HEADS + kvh)[:, None] * D + offs_d[None, :]
        kt = tl.load(k_ptr + addr, mask=in_range[:, None], other=0.0)
        vt = tl.load(v_ptr + addr, mask=in_range[:, None], other=0.0)
        acc, m_i, l_i = fold_key_tile(acc, m_i, l_i, q, kt, vt, ok, IEEE)
    for u0 in range(lo, hi, BLOCK_N):
        u = u0 + tl.arange(0, BLOCK_N)
        in_range = u < hi
        kpos = c0 + u
        ok = (in_range & (u < cnt))[None, :] & (kpos[None, :] <= p[:, None])
        if window > 0:
            ok = ok & ((kpos[None, :] < anchors) | (kpos[None, :] > p[:, None] - window))
        ok = ok | (u[None, :] == t[:, None])  # itself: a discarded row's softmax is never empty
        addr = ((start + u) * KV_HEADS + kvh)[:, None] * D + offs_d[None, :]
        kt = tl.load(k_ptr + addr, mask=in_range[:, None], other=0.0)
        vt = tl.load(v_ptr + addr, mask=in_range[:, None], other=0.0)
        acc, m_i, l_i = fold_key_tile(acc, m_i, l_i, q, kt, vt, ok, IEEE)

    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(out_ptr + q_addr, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


def packed_window_attention(q, k, v, k_cache, v_cache, slots, cu: np.ndarray, cache_len, count, anchors: int,
                            window: int, ring: int, scale: float, rows: int | None = None,
                            block_n: int = 16) -> torch.Tensor:
    """Same contract as packed_window_attention_ref: q [N, H, D] packed by cu [B + 1] (host) ->
    out [N, H, D]; the cache is written. `rows` is accepted for the contract; the kernel reads
    the slot's A + R rows, masked by index."""
    N, heads, d = q.shape
    out = torch.empty_like(q)
    if N == 0:
        return out
    kv_heads, cap = k_cache.shape[1], k_cache.shape[2]
    group = heads // kv_heads
    block_g = triton.next_power_of_2(group)
    block_l = max(64 // block_g, 1)  # 64 query rows (rows x heads of a group) per tile
    req, r0 = packed_tiles(cu, block_l)
    if len(req) == 0:
        return out
    host = to_device(np.concatenate([cu, req, r0]), q.device)  # one copy, no sync
    cu_dev, tile_req, tile_r0 = host[: len(cu)], host[len(cu) : len(cu) + len(req)], host[len(cu) + len(req) :]
    k, v, q = k.contiguous(), v.contiguous(), q.contiguous()
    _packed_attention_kernel[(len(req), kv_heads)](
        q, k, v, k_cache, v_cache, out, slots.to(torch.int32).contiguous(), cu_dev,
        cache_len.to(torch.int32).contiguous(), count.to(torch.int32).contiguous(), tile_req, tile_r0,
        scale, anchors, window, ring,
        HEADS=heads, KV_HEADS=kv_heads, D=d, CAP=cap, GROUP=group, BLOCK_G=block_g, BLOCK_L=block_l,
        BLOCK_N=block_n, IEEE=q.dtype == torch.float32)
    write_packed_rows(k_cache, v_cache, k, v, slots, cu, cache_len, count, anchors, ring)
    return out
