"""Triton kernel: text-anchored window attention over the draft's ring cache, cache write folded in.

Same contract as window_attention_ref.ring_window_attention_ref (read its docstring for the
addressing). One program per (request, kv head, query tile): the tile's rows times the kv
head's query-head group form one [BLOCK_M, D] query block, so the heads of a group share every
key load, and scores go through tl.dot. Keys come from two places, in two loops with one
online softmax (fp32): the slot's A + R cached rows (the text index each row holds is computed
from cache_len, never stored) and this forward's own rows. The masks are index arithmetic,
never materialised.

It serves the fixed-shape layouts: decode and verify steps (L = K + 1) and chained forwards
(L = 1). Their rows fit one query tile, so the program that read the slot's rows also stores the
forward's rows afterwards: no other program touches that (slot, kv head), so the write needs no
second launch (a longer layout is written by a second launch after every tile has read the
cache). Steps with prompt chunks store their packed rows with one torch scatter
(window_attention_ref.write_packed_rows) and attend only each request's last entry, as a
[B, 1] layout through this kernel.
Set TRITON_INTERPRET=1 before importing to run on CPU (tests).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def fold_key_tile(acc, m_i, l_i, q, kt, vt, ok, IEEE: tl.constexpr):
    """Fold one key tile (kt/vt [BLOCK_N, D], ok [BLOCK_M, BLOCK_N]) into the softmax state.
    Dot products take the inputs' dtype (fp16/bf16: tensor cores) and accumulate in fp32; fp32
    inputs use IEEE products (not TF32), so the fp32 path equals the torch reference."""
    if IEEE:
        s = tl.dot(q, tl.trans(kt), input_precision="ieee")  # [BLOCK_M, BLOCK_N] (q pre-scaled)
    else:
        s = tl.dot(q, tl.trans(kt))
    s = tl.where(ok, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if IEEE:
        acc = acc * alpha[:, None] + tl.dot(p, vt, input_precision="ieee")
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt)
    return acc, m_new, l_i


@triton.jit
def fold_cache_rows(acc, m_i, l_i, q, kc_ptr, vc_ptr, cache_base, last, p, anchors, window, ring,
                    D: tl.constexpr, CAP: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr):
    """Fold a slot's cached rows into the softmax state of queries at text indices p [BLOCK_M]:
    row j holds text index idx (or nothing) when the slot has entries 0..last; rows past the
    entries held (j > last) are empty and not read."""
    offs_d = tl.arange(0, D)
    for j0 in range(0, tl.minimum(CAP, last + 1), BLOCK_N):
        j = j0 + tl.arange(0, BLOCK_N)
        in_cap = j < CAP
        ring_idx = last - ((last - j) % ring + ring) % ring
        idx = tl.where(j < anchors, j, ring_idx)
        live = in_cap & (idx <= last) & ((j < anchors) | (idx >= anchors))
        ok = live[None, :] & (idx[None, :] <= p[:, None])
        if window > 0:
            ok = ok & ((idx[None, :] < anchors) | (idx[None, :] > p[:, None] - window))
        addr = (cache_base + j)[:, None] * D + offs_d[None, :]
        kt = tl.load(kc_ptr + addr, mask=in_cap[:, None], other=0.0).to(q.dtype)
        vt = tl.load(vc_ptr + addr, mask=in_cap[:, None], other=0.0).to(q.dtype)
        acc, m_i, l_i = fold_key_tile(acc, m_i, l_i, q, kt, vt, ok, IEEE)
    return acc, m_i, l_i


@triton.jit
def _ring_attention_kernel(
        q_ptr, k_ptr, v_ptr, kc_ptr, vc_ptr, out_ptr, slots_ptr, pos_ptr, valid_ptr, cache_len_ptr,
        scale, anchors, window, ring, L,
        HEADS: tl.constexpr, KV_HEADS: tl.constexpr, D: tl.constexpr, CAP: tl.constexpr,
        GROUP: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_N: tl.constexpr,
        FOLD_WRITE: tl.constexpr, IEEE: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)  # int64 offsets: B x L x heads x D can pass 2^31
    kvh = tl.program_id(1)
    tile = tl.program_id(2)
    BLOCK_M: tl.constexpr = BLOCK_L * BLOCK_G
    offs_m = tl.arange(0, BLOCK_M)
    t = tile * BLOCK_L + offs_m // BLOCK_G  # query row within the request
    g = offs_m % BLOCK_G  # head within the group
    row_ok = (t < L) & (g < GROUP)
    head = kvh * GROUP + g
    offs_d = tl.arange(0, D)
    p = tl.load(pos_ptr + b * L + t, mask=t < L, other=0)  # [BLOCK_M] query text index
    q_addr = ((b * L + t) * HEADS + head)[:, None] * D + offs_d[None, :]
    q = tl.load(q_ptr + q_addr, mask=row_ok[:, None], other=0.0)
    q = (q.to(tl.float32) * scale).to(q_ptr.dtype.element_ty)  # [BLOCK_M, D], pre-scaled
    slot = tl.load(slots_ptr + b).to(tl.int64)
    last = tl.load(cache_len_ptr + b) - 1
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)

    # 1. the slot's cached rows
    cache_base = (slot * KV_HEADS + kvh) * CAP
    acc, m_i, l_i = fold_cache_rows(acc, m_i, l_i, q, kc_ptr, vc_ptr, cache_base, last, p, anchors, window, ring,
                                    D, CAP, BLOCK_N, IEEE)

    # 2. this forward's rows (always including the query row itself)
    for u0 in range(0, L, BLOCK_N):
        u = u0 + tl.arange(0, BLOCK_N)
        in_l = u < L
        kpos = tl.load(pos_ptr + b * L + u, mask=in_l, other=0)
        kval = tl.load(valid_ptr + b * L + u, mask=in_l, other=0) != 0
        ok = (kval & in_l)[None, :] & (kpos[None, :] <= p[:, None])
        if window > 0:
            ok = ok & ((kpos[None, :] < anchors) | (kpos[None, :] > p[:, None] - window))
        ok = ok | (u[None, :] == t[:, None])
        addr = ((b * L + u) * KV_HEADS + kvh)[:, None] * D + offs_d[None, :]
        kt = tl.load(k_ptr + addr, mask=in_l[:, None], other=0.0)
        vt = tl.load(v_ptr + addr, mask=in_l[:, None], other=0.0)
        acc, m_i, l_i = fold_key_tile(acc, m_i, l_i, q, kt, vt, ok, IEEE)

    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(out_ptr + q_addr, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])

    if FOLD_WRITE:  # every row of the request is in this tile, and the cache reads are done
        _write_rows(k_ptr, v_ptr, kc_ptr, vc_ptr, pos_ptr, valid_ptr, b, kvh, cache_base, anchors, ring, L,
                    KV_HEADS, D, BLOCK_L)


@triton.jit
def _write_rows(k_ptr, v_ptr, kc_ptr, vc_ptr, pos_ptr, valid_ptr, b, kvh, cache_base, anchors, ring, L,
                KV_HEADS: tl.constexpr, D: tl.constexpr, BLOCK_L: tl.constexpr):
    """Store request b's valid rows for one kv head: anchors and the last R indices."""
    offs_d = tl.arange(0, D)
    newest = -1
    for u0 in range(0, L, BLOCK_L):
        u = u0 + tl.arange(0, BLOCK_L)
        kpos = tl.load(pos_ptr + b * L + u, mask=u < L, other=0)
        kval = (tl.load(valid_ptr + b * L + u, mask=u < L, other=0) != 0) & (u < L)
        newest = tl.maximum(newest, tl.max(tl.where(kval, kpos, -1), axis=0))
    for u0 in range(0, L, BLOCK_L):
        u = u0 + tl.arange(0, BLOCK_L)
        kpos = tl.load(pos_ptr + b * L + u, mask=u < L, other=0)
        kval = (tl.load(valid_ptr + b * L + u, mask=u < L, other=0) != 0) & (u < L)
        keep = kval & ((kpos < anchors) | (kpos > newest - ring))
        row = tl.where(kpos < anchors, kpos, anchors + ((kpos - anchors) % ring + ring) % ring)
        src = ((b * L + u) * KV_HEADS + kvh)[:, None] * D + offs_d[None, :]
        dst = (cache_base + row)[:, None] * D + offs_d[None, :]
        kt = tl.load(k_ptr + src, mask=keep[:, None], other=0.0)
        vt = tl.load(v_ptr + src, mask=keep[:, None], other=0.0)
        tl.store(kc_ptr + dst, kt.to(kc_ptr.dtype.element_ty), mask=keep[:, None])
        tl.store(vc_ptr + dst, vt.to(vc_ptr.dtype.element_ty), mask=keep[:, None])


@triton.jit
def _ring_write_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, slots_ptr, pos_ptr, valid_ptr, anchors, ring, L,
                       KV_HEADS: tl.constexpr, D: tl.constexpr, CAP: tl.constexpr, BLOCK_L: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    slot = tl.load(slots_ptr + b).to(tl.int64)
    _write_rows(k_ptr, v_ptr, kc_ptr, vc_ptr, pos_ptr, valid_ptr, b, kvh, (slot * KV_HEADS + kvh) * CAP,
                anchors, ring, L, KV_HEADS, D, BLOCK_L)


def ring_window_attention(q, k, v, k_cache, v_cache, slots, pos, valid, cache_len, anchors: int,
                          window: int, ring: int, scale: float, block_n: int = 16) -> torch.Tensor:
    """Same contract as ring_window_attention_ref: q [B, L, H, D] -> [B, L, H, D], cache written."""
    B, L, heads, d = q.shape
    # Contiguous whatever q's strides (empty_like would copy a dense but permuted q's layout, and
    # the kernel writes out densely in [B, L, H, D] order).
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if B == 0 or L == 0:
        return out
    kv_heads, cap = k_cache.shape[1], k_cache.shape[2]
    group = heads // kv_heads
    block_g = triton.next_power_of_2(group)
    # tl.dot wants >= 16 query rows per tile; a request of up to 64 / group rows (every decode,
    # verify and chained forward) fits one tile, so its program can also write the cache.
    min_l = max(16 // block_g, 1)
    block_l = max(min_l, min(triton.next_power_of_2(L), max(64 // block_g, min_l)))
    tiles = triton.cdiv(L, block_l)
    fold = tiles == 1
    k, v, q = k.contiguous(), v.contiguous(), q.contiguous()
    pos32, valid8 = pos.to(torch.int32).contiguous(), valid.to(torch.int8).contiguous()
    slots32, len32 = slots.to(torch.int32).contiguous(), cache_len.to(torch.int32).contiguous()
    _ring_attention_kernel[(B, kv_heads, tiles)](
        q, k, v, k_cache, v_cache, out, slots32, pos32, valid8, len32,
        scale, anchors, window, ring, L,
        HEADS=heads, KV_HEADS=kv_heads, D=d, CAP=cap, GROUP=group, BLOCK_G=block_g, BLOCK_L=block_l,
        BLOCK_N=block_n, FOLD_WRITE=fold, IEEE=q.dtype == torch.float32)
    if not fold:
        _ring_write_kernel[(B, kv_heads)](k, v, k_cache, v_cache, slots32, pos32, valid8, anchors, ring, L,
                                          KV_HEADS=kv_heads, D=d, CAP=cap, BLOCK_L=block_l)
    return out
