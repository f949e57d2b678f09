"""Plain torch reference of the two kernels in window_attention.py (same arguments, same result).

The batch is flat: query row i belongs to request row_req[i] and sits at text index row_pos[i].
Row i attends to the text indices of its request that are anchors (< A) or in its window
(> row_pos[i] - W), and <= row_pos[i] (causal); W = 0 means every earlier text index.
Key index j of request r lives at cache slot block_tables[r, j // bs] * bs + j % bs.
"""

from __future__ import annotations

import torch


def write_kv_ref(k_cache, v_cache, slot_mapping, k, v) -> None:
    """k_cache/v_cache [blocks, bs, kv_heads, D]; slot_mapping [N]; k/v [N, kv_heads, D]."""
    flat_k = k_cache.view(-1, *k_cache.shape[2:])
    flat_v = v_cache.view(-1, *v_cache.shape[2:])
    flat_k[slot_mapping.long()] = k.to(k_cache.dtype)
    flat_v[slot_mapping.long()] = v.to(v_cache.dtype)


def window_attention_ref(q, k_cache, v_cache, block_tables, row_req, row_pos, anchors: int,
                         window: int, scale: float) -> torch.Tensor:
    """q [N, H, D] -> out [N, H, D]; block_tables [R, max_blocks]; row_req, row_pos [N]."""
    n, heads, _ = q.shape
    bs, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = heads // kv_heads
    out = torch.empty_like(q)
    for i in range(n):
        pos, req = int(row_pos[i]), int(row_req[i])
        idx = torch.arange(pos + 1)
        keep = idx < anchors
        keep |= idx > pos - window if window > 0 else torch.ones_like(keep)
        idx = idx[keep]  # [L] text indices row i reads
        slots = block_tables[req, idx // bs].long() * bs + idx % bs
        keys = k_cache.view(-1, kv_heads, k_cache.shape[3])[slots].float()  # [L, kv, D]
        values = v_cache.view(-1, kv_heads, v_cache.shape[3])[slots].float()
        keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)  # [L, H, D]
        scores = torch.einsum("hd,lhd->hl", q[i].float(), keys) * scale  # [H, L]
        out[i] = torch.einsum("hl,lhd->hd", scores.softmax(-1), values).to(q.dtype)
    return out
