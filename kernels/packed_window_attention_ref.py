"""Window attention over packed rows (a step where prompt chunks join decodes), in plain torch:
the reference of packed_window_attention.py and the CPU path itself.

Packed layout: request b owns rows cu[b]:cu[b + 1] of q/k/v [N, heads | kv_heads, D], with
no padding between requests. Row j of request b (j = 0, 1, ...) is the entry at text index
cache_len[b] + j; its first count[b] rows are real entries (stored, visible as keys), the rest
are queries whose outputs the caller discards (a prompt's last state waiting for its next token,
slack rows of an upper-bounded layout). A row at index p attends to
  - the slot's cached entries i < cache_len with i < A or i > p - W (ring rows, window_attention_ref),
  - this forward's real rows at indices i <= p with i < A or i > p - W, and always itself,
then the real rows are stored (anchors, and the last R of each request).

Bounded by the window, never by the chunk: rows are cut into query tiles of T rows, and tile
(b, r0) reads only the keys any of its rows can see: the slot's A + R cache rows, request b's
first A rows (anchors; only those left of the band) and the band of rows r0 - W + 1 .. r0 + T - 1.
Worked example, A = 2, W = 3, T = 4, a request with cache_len 0 and 10 rows: tile r0 = 4 reads
anchors 0 1 and band rows 2..7 (row 4 sees 0 1 2 3 4; row 7 sees 0 1 5 6 7); the cost per row is
A + W + T keys whatever the chunk's length. Tiles go through SDPA in groups that fit a byte budget,
so the step's memory is bounded too.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .window_attention_ref import key_visible, ring_stored_index, ring_write_rows

TILE = 64  # query rows per tile (the Triton kernel's BLOCK_L * BLOCK_G is at most this)
GROUP_BYTES = 256 << 20  # score and key bytes of one SDPA call over a group of tiles


def to_device(host: np.ndarray, device) -> torch.Tensor:
    """Host int64 array -> device tensor without a device sync (pinned, asynchronous on CUDA)."""
    t = torch.from_numpy(np.ascontiguousarray(host, dtype=np.int64))
    if torch.device(device).type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def packed_tiles(cu: np.ndarray, tile: int, requests: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Host: (request, first row within the request) of every query tile of the given requests
    (default: all). Worked example, cu = [0, 3, 3, 12], tile 4: requests own 3, 0 and 9 rows ->
    tiles (0, 0) (2, 0) (2, 4) (2, 8)."""
    requests = np.arange(len(cu) - 1) if requests is None else requests
    per = -(-np.diff(cu)[requests] // tile)  # ceil; a request without rows has no tile
    req = np.repeat(requests, per)
    first = np.repeat(np.cumsum(per) - per, per)
    return req, (np.arange(int(per.sum())) - first) * tile


def tile_classes(cu: np.ndarray, tile: int, empty: np.ndarray | None = None) -> dict[tuple[int, bool], np.ndarray]:
    """Requests by query-tile size (the next power of two of their rows, at most `tile`, so a
    decode's K + 1 rows are not padded to a prompt chunk's tile) and by whether the host knows
    their cache is empty (a new request reads no cache row). {(tile size, empty): requests}."""
    lens = np.diff(cu)
    size = np.minimum(tile, 1 << np.ceil(np.log2(np.maximum(lens, 1))).astype(np.int64))
    empty = np.zeros(len(lens), dtype=bool) if empty is None else np.asarray(empty, dtype=bool)
    keys = sorted({(int(t), bool(e)) for t, e, n in zip(size, empty, lens) if n > 0})
    return {(t, e): np.flatnonzero((size == t) & (empty == e) & (lens > 0)) for t, e in keys}


def band_width(longest: int, tile: int, window: int) -> int:
    """In-step key columns of a tile: its rows and the W - 1 before, never more than the rows a
    request of `longest` rows has before the tile's end (all of them when there is no window,
    W = 0): a decode's tile reads its K + 1 rows, not W."""
    reach = max(tile, -(-longest // tile) * tile)
    return reach if window <= 0 else min(tile + window - 1, reach)


def packed_window_attention_ref(q, k, v, k_cache, v_cache, slots, cu: np.ndarray, cache_len, count,
                                anchors: int, window: int, ring: int, scale: float, rows: int | None = None,
                                tile: int = TILE, group_bytes: int = GROUP_BYTES,
                                empty: np.ndarray | None = None) -> torch.Tensor:
    """q [N, H, D], k/v [N, kv_heads, D] packed by cu [B + 1] (host); slots, cache_len,
    count [B] (device) -> out [N, H, D]; stores the real rows in the cache.
    rows: only the first `rows` cache rows of these slots can hold an entry (None: all);
    empty [B] (host): requests whose cache_len the host knows is 0 (their tiles read no cache)."""
    N, heads, d = q.shape
    out = q.new_empty(N + 1, heads, d)  # row N: where tile rows past their request's end go
    if N == 0:
        return out[:N]
    S_all = k_cache.shape[2] if rows is None else min(rows, k_cache.shape[2])
    dev = q.device
    host = to_device(np.concatenate([cu[:-1], np.diff(cu)]), dev)  # one copy
    starts, lens = host[: len(cu) - 1], host[len(cu) - 1 :]
    for (t, no_cache), requests in tile_classes(cu, tile, empty).items():
        S = 0 if no_cache else S_all
        tile_req, tile_r0 = packed_tiles(cu, t, requests)
        band = band_width(int(np.diff(cu)[requests].max()), t, window)
        n_anchor = anchors if window > 0 else 0  # without a window the band starts at row 0
        keys_per_tile = S + n_anchor + band
        per_tile = heads * t * keys_per_tile * 4 + 2 * k.shape[1] * keys_per_tile * d * q.element_size()
        step = max(1, group_bytes // per_tile)
        tiles = to_device(np.concatenate([tile_req, tile_r0]), dev)
        nt = len(tile_req)
        for g0 in range(0, nt, step):
            treq, tr0 = tiles[g0 : min(g0 + step, nt)], tiles[nt + g0 : nt + min(g0 + step, nt)]
            o = _tiles(q, k, v, k_cache, v_cache, slots[treq], starts[treq], lens[treq], tr0, cache_len[treq],
                       count[treq], anchors, window, ring, scale, S, n_anchor, band, t)  # [g, t, H, D]
            qo = tr0[:, None] + torch.arange(t, device=dev)  # [g, t] row within the request
            dest = torch.where(qo < lens[treq][:, None], starts[treq][:, None] + qo, N)  # no boolean index: no sync
            out[dest.flatten()] = o.flatten(0, 1)
    write_packed_rows(k_cache, v_cache, k, v, slots, cu, cache_len, count, anchors, ring)
    return out[:N]


def write_packed_rows(k_cache, v_cache, k, v, slots, cu: np.ndarray, cache_len, count, anchors: int,
                      ring: int) -> None:
    """Store each request's real rows that a later query can read: its anchors and its last R."""
    lens = np.diff(cu)
    row_req_host = np.repeat(np.arange(len(lens)), lens)  # [N]
    host = to_device(np.concatenate([row_req_host, np.arange(k.shape[0]) - cu[:-1][row_req_host]]), k.device)
    row_req, j = host[: k.shape[0]], host[k.shape[0] :]  # request of each row, row within it
    c0, cnt = cache_len[row_req], count[row_req]
    keep = (j < cnt) & ((c0 + j < anchors) | (j > cnt - 1 - ring))
    ring_write_rows(k_cache, v_cache, slots[row_req], c0 + j, keep, k, v, anchors, ring)


def _tiles(q, k, v, k_cache, v_cache, slots, start, n, r0, c0, cnt, anchors, window, ring, scale, S, n_anchor,
           band, tile):
    """Attention of a group of t tiles: tile i holds rows r0[i] .. r0[i] + tile - 1 of a request
    whose rows start at packed row start[i] (n[i] rows, cnt[i] real, cache_len c0[i])."""
    N, dev = q.shape[0], q.device
    qo = r0[:, None] + torch.arange(tile, device=dev)  # [t, tile] query row within the request
    q_idx = c0[:, None] + qo  # text index
    lo = r0 + tile - band  # [t] first band row (negative: before the request's first row)
    aj = torch.arange(n_anchor, device=dev)[None, :].expand(len(r0), -1)  # [t, a]
    a_ok = (aj < cnt[:, None]) & (aj < lo[:, None]) & (c0[:, None] + aj < anchors)  # left of the band only
    bj = lo[:, None] + torch.arange(band, device=dev)  # [t, band]
    b_ok = (bj >= 0) & (bj < cnt[:, None])
    key_row = torch.cat([aj, bj], 1)  # [t, a + band] row within the request
    step_idx = torch.where(torch.cat([a_ok, b_ok], 1), c0[:, None] + key_row, -1)
    gather = (start[:, None] + key_row).clamp(0, N - 1)  # [t, a + band] packed row
    kc = k_cache[:, :, :S].index_select(0, slots)  # [t, kv, S, D], before this forward's write
    vc = v_cache[:, :, :S].index_select(0, slots)
    keys = torch.cat([kc.to(q.dtype), k[gather].transpose(1, 2).to(q.dtype)], 2)  # [t, kv, S + a + band, D]
    values = torch.cat([vc.to(q.dtype), v[gather].transpose(1, 2).to(q.dtype)], 2)
    key_idx = torch.cat([ring_stored_index(c0, anchors, ring, S), step_idx], 1)  # [t, S + a + band]
    mask = key_visible(key_idx, q_idx, anchors, window)  # [t, tile, S + a + band]
    # Every query sees itself (band column band - tile + u), so a discarded row's softmax is
    # never empty (finite: its key row exists, a real or a clamped one).
    u = torch.arange(tile, device=dev)
    mask[:, u, S + n_anchor + band - tile + u] = True
    qt = q[(start[:, None] + qo).clamp(max=N - 1)]  # [t, tile, H, D]
    o = F.scaled_dot_product_attention(qt.transpose(1, 2), keys, values, attn_mask=mask[:, None], scale=scale,
                                       enable_gqa=q.shape[1] != k.shape[1])  # [t, H, tile, D]
    return o.transpose(1, 2)
