"""The draft's KV cache: text positions only, one fixed ring per request slot.

Index space: every request counts its text tokens 0, 1, 2, ... (visual placeholders are never
counted), and that text index is both the cache index and the draft's rotary position. A
query at text index p attends to keys i <= p with i < A (anchors) or i > p - W (window).

Storage: one slot per request the engine can hold at once (max_num_seqs), each A + R rows:

    text index i  ->  row i                      if i < A      (anchors, written once)
                      row A + (i - A) mod R      otherwise      (a ring of R >= W + K rows)

Worked example, A = 2, W = 3, R = 4 (K = 1): indices 0..9 land in rows
    0 1 | 2 3 4 5 2 3 4 5      (index 7 overwrote index 3, which no query >= 7 can see).
The K - 1 entries the draft chains past the committed end land in rows whose previous indices
are all older than any window still to be read, and the next step's commits overwrite them,
so nothing is ever allocated, trimmed or freed while serving. The memory is fixed at start-up:
(max_num_seqs + 1) x kv_heads x (A + R) x head_dim x 2 (K, V) x dtype bytes; the extra slot
is a sink that absorbs writes of padding rows. With window_tokens null (the no-window
ablation) the ring holds every text index the server can reach (R = max text tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class WindowSpec:
    anchors: int  # A: first text tokens every query sees
    window: int | None  # W: last text tokens every query sees (itself included); None = all

    def mask(self, q_idx: torch.Tensor, k_idx: torch.Tensor) -> torch.Tensor:
        """[len(q), len(k)] True where query q may attend key k (dense reference, training)."""
        q, k = q_idx[:, None], k_idx[None, :]
        allowed = k <= q
        if self.window is not None:
            allowed &= (k < self.anchors) | (k > q - self.window)
        return allowed


@dataclass
class WindowBatch:
    """One draft forward's rows, laid out [B, L]: row (b, u) is an entry of request b.

    Everything the attention backends need, on the device, with fixed shapes per (B, L).
    """

    slots: torch.Tensor  # [B] int64 cache slot of each request
    pos: torch.Tensor  # [B, L] int64 text index of each row (its query position and key index)
    valid: torch.Tensor  # [B, L] bool: a real entry (stored, visible as a key); padding is not
    cache_len: torch.Tensor  # [B] int64 entries of the request in the cache before this forward
    # Host bound: only the first `rows` cache rows of these slots can hold an entry (no slot has
    # reached its ring's end yet), so readers may skip the rest. None: any row may.
    rows: int | None = None


@dataclass
class PackedRows:
    """A step's entries packed request after request, no padding between requests (steps with
    prompt chunks): request b owns rows cu[b]:cu[b + 1]; its row j is the entry at text index
    cache_len[b] + j, a real entry (stored) when j < count[b].

    Worked example: a decode with 4 rows (3 real) beside a 600-row prompt chunk (all real) is
    cu = [0, 4, 604], count = [3, 600]: 604 rows through the draft's projections, not 2 x 600.
    """

    slots: torch.Tensor  # [B] int64 cache slot of each request
    cu: np.ndarray  # [B + 1] host: row offsets
    cache_len: torch.Tensor  # [B] int64 entries of the request in the cache before this forward
    count: torch.Tensor  # [B] int64 real rows of the request (a prefix of its rows)


class TextWindowCache:
    """K/V rings of every request slot, allocated once: [slots + 1, kv_heads, A + R, D].

    Addressing, reads and writes live with the kernels (kernels/window_attention_ref.py holds
    the slot rule once, in torch; kernels/window_attention.py the same in Triton); this class
    owns the storage and its size."""

    def __init__(self, spec: WindowSpec, num_slots: int, lookahead: int, max_text_tokens: int,
                 num_kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device | str) -> None:
        self.spec = spec
        self.lookahead = max(lookahead, 1)  # K: draft tokens per step (K - 1 chained entries)
        self.anchors = spec.anchors
        self.ring = self.ring_rows(spec, lookahead, max_text_tokens)  # R
        self.capacity = self.anchors + self.ring  # rows per slot
        self.num_slots = num_slots
        # + 1: the sink slot, where padding rows write and nothing reads
        shape = (num_slots + 1, num_kv_heads, self.capacity, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    @staticmethod
    def ring_rows(spec: WindowSpec, lookahead: int, max_text_tokens: int) -> int:
        if spec.window is None:  # every text index keeps its own row: nothing wraps
            return max(1, max_text_tokens) + max(lookahead, 1)
        return spec.window + max(lookahead, 1)

    @classmethod
    def bytes_needed(cls, spec: WindowSpec, num_slots: int, lookahead: int, max_text_tokens: int,
                     num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        rows = spec.anchors + cls.ring_rows(spec, lookahead, max_text_tokens)
        elem = torch.empty((), dtype=dtype).element_size()
        return 2 * (num_slots + 1) * num_kv_heads * rows * head_dim * elem

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2

    @property
    def bytes_per_slot(self) -> int:
        return self.k[0].numel() * self.k.element_size() * 2
