"""Plain torch reference of the kernel in window_attention.py, and the CPU path itself.

The draft's cache holds, per request slot, A anchor rows and a ring of R rows
([slots + 1, kv_heads, A + R, D]); text index i lives at

    row(i) = i                    if i < A
             A + (i - A) mod R    otherwise

One draft forward is a [B, L] layout: row (b, u) of request b has text index pos[b, u], is a real
entry when valid[b, u], and the slot held cache_len[b] entries (indices 0..cache_len-1) before
the forward. A row at index p attends to
  - cached entries i < cache_len with i < A or i > p - W, and
  - this forward's valid rows at indices i <= p with i < A or i > p - W (and always itself),
then the forward's valid rows are stored: anchors, and the last R indices of the forward
(a prompt chunk longer than the ring keeps only what any later query can read). Steps with
prompt chunks store their packed rows with write_packed_rows (no attention: only each request's
last entry is attended, as a [B, 1] forward).
W = 0 means no window (every earlier index). Nothing here imports the package: the kernels
and their reference stand alone.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def ring_row(idx: torch.Tensor, anchors: int, ring: int) -> torch.Tensor:
    """Cache row of text index idx (any shape)."""
    return torch.where(idx < anchors, idx, anchors + torch.remainder(idx - anchors, ring))


def ring_stored_index(cache_len: torch.Tensor, anchors: int, ring: int, rows: int | None = None) -> torch.Tensor:
    """[B, A + R] text index each row holds when the slot has entries 0..cache_len-1 (-1: none);
    [B, rows] for the first `rows` rows only.

    Ring row j holds the newest i <= last = cache_len - 1 with row(i) = j, which is
    i = last - ((last - j) mod R). Worked example, A = 2, R = 4, cache_len = 9 (last = 8):
    indices 2..8 went to rows 2 3 4 5 2 3 4, so rows 0..5 hold 0 1 6 7 8 5
    (row 2: 8 - (6 mod 4) = 6; row 5: 8 - (3 mod 4) = 5).
    """
    j = torch.arange(anchors + ring if rows is None else rows, device=cache_len.device)[None, :]  # [1, A + R]
    last = (cache_len - 1)[:, None]  # [B, 1]
    idx = torch.where(j < anchors, j, last - torch.remainder(last - j, ring))
    live = (idx <= last) & ((j < anchors) | (idx >= anchors))
    return torch.where(live, idx, -1)


def key_visible(key_idx: torch.Tensor, q_idx: torch.Tensor, anchors: int, window: int) -> torch.Tensor:
    """[B, Lq, S]: query at q_idx [B, Lq] may read the key at key_idx [B, S] (-1: no key there)."""
    k, q = key_idx[:, None, :], q_idx[:, :, None]
    ok = (k >= 0) & (k <= q)
    if window > 0:
        ok = ok & ((k < anchors) | (k > q - window))
    return ok


def ring_key_index(pos, valid, cache_len, anchors: int, ring: int) -> torch.Tensor:
    """[B, A + R + L] text index of every key a forward reads: the slot's rows, then its own rows
    (-1 where there is none: an empty row, a padding row)."""
    return torch.cat([ring_stored_index(cache_len, anchors, ring), torch.where(valid, pos, -1)], 1)


def ring_key_mask(pos, valid, cache_len, anchors: int, window: int, ring: int) -> torch.Tensor:
    """[B, L, A + R + L]: which keys (the slot's rows, then the forward's rows) each row reads.
    A padding row sees itself, so its (discarded) softmax is never empty."""
    mask = key_visible(ring_key_index(pos, valid, cache_len, anchors, ring), pos, anchors, window)
    L = pos.shape[1]
    mask[:, :, -L:] |= torch.eye(L, dtype=torch.bool, device=pos.device)
    return mask


def ring_write_ref(k_cache, v_cache, slots, pos, valid, k, v, anchors: int, ring: int) -> None:
    """Store the valid rows of k/v [B, L, kv_heads, D]; rows that are not kept go to the last
    (sink) slot of the cache."""
    newest = torch.where(valid, pos, -1).amax(1, keepdim=True)  # [B, 1]
    keep = valid & ((pos < anchors) | (pos > newest - ring))  # [B, L]
    slot = slots[:, None].expand_as(pos)  # [B, L]
    ring_write_rows(k_cache, v_cache, slot.flatten(), pos.flatten(), keep.flatten(), k.flatten(0, 1),
                    v.flatten(0, 1), anchors, ring)


def write_packed_rows(k_cache, v_cache, k, v, slots, cu: np.ndarray, cache_len, count, anchors: int,
                      ring: int) -> None:
    """Store packed rows (request b owns rows cu[b]:cu[b + 1] of k/v [N, kv_heads, D], its row j
    the entry at text index cache_len[b] + j, real when j < count[b]; cu on the host): each
    request's real rows that a later query can read, its anchors and its last R."""
    lens = np.diff(cu)
    row_req_host = np.repeat(np.arange(len(lens)), lens)  # [N]
    host = torch.from_numpy(np.concatenate([row_req_host, np.arange(k.shape[0]) - cu[:-1][row_req_host]]))
    host = host.pin_memory().to(k.device, non_blocking=True) if k.is_cuda else host.to(k.device)  # no sync
    row_req, j = host[: k.shape[0]], host[k.shape[0] :]  # request of each row, row within it
    c0, cnt = cache_len.index_select(0, row_req), count.index_select(0, row_req)
    keep = (j < cnt) & ((c0 + j < anchors) | (j > cnt - 1 - ring))
    ring_write_rows(k_cache, v_cache, slots.index_select(0, row_req), c0 + j, keep, k, v, anchors, ring)


def ring_write_rows(k_cache, v_cache, slot, pos, keep, k, v, anchors: int, ring: int) -> None:
    """Store rows k/v [N, kv_heads, D] where keep [N]: row n at text index pos[n] of slot[n]; the
    others write to the last (sink) slot, which nothing reads (one scatter, no host read)."""
    sink = k_cache.shape[0] - 1
    slot = torch.where(keep, slot, sink)  # [N]
    row = torch.where(keep, ring_row(pos, anchors, ring), 0)  # [N]
    if k.dtype != k_cache.dtype:
        k, v = k.to(k_cache.dtype), v.to(v_cache.dtype)
    k_cache[slot, :, row] = k
    v_cache[slot, :, row] = v


def ring_window_attention_ref(q, k, v, k_cache, v_cache, slots, pos, valid, cache_len, anchors: int,
                              window: int, ring: int, scale: float) -> torch.Tensor:
    """q [B, L, H, D], k/v [B, L, kv_heads, D] -> out [B, L, H, D]; stores k/v in the cache.

    One gather of the batch's slots and one masked SDPA (GQA) for the whole batch.
    """
    kc, vc = k_cache.index_select(0, slots), v_cache.index_select(0, slots)  # [B, kv, A + R, D], before writing
    if kc.dtype != q.dtype:
        kc, vc = kc.to(q.dtype), vc.to(q.dtype)
    keys = torch.cat([kc, k.transpose(1, 2).to(q.dtype)], 2)  # [B, kv, A + R + L, D]
    values = torch.cat([vc, v.transpose(1, 2).to(q.dtype)], 2)
    mask = ring_key_mask(pos, valid, cache_len, anchors, window, ring)[:, None]  # [B, 1, L, A + R + L]
    out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=mask, scale=scale,
                                         enable_gqa=q.shape[2] != k.shape[2])  # [B, H, L, D]
    ring_write_ref(k_cache, v_cache, slots, pos, valid, k, v, anchors, ring)
    return out.transpose(1, 2)
