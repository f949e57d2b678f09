"""The draft's KV cache: text positions only, paged, with its own allocator.

Index space: every request counts its text tokens 0, 1, 2, ... (visual placeholders are never
counted), and that text index is both the cache index and the draft's rotary position. A
query at text index q attends to keys k <= q with k < anchors or k > q - window.
Blocks whose every index is below the window of all future queries (and not an anchor) are
freed as the request advances, so a request holds at most about
ceil(anchors / block) + ceil((window + lookahead) / block) + 1 blocks however long it runs,
and nothing at all for its visual tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FREED = -1  # block-table entry of a block given back to the pool


@dataclass(frozen=True)
class WindowSpec:
    anchors: int  # A: first text tokens every query sees
    window: int | None  # W: last text tokens every query sees (itself included); None = all

    def first_live_index(self, next_query: int) -> int:
        """Smallest non-anchor index any query >= next_query can still attend to."""
        if self.window is None:
            return 0
        return max(0, next_query - self.window + 1)

    def key_indices(self, q_lo: int, q_hi: int) -> torch.Tensor:
        """Union of the keys that queries q_lo..q_hi-1 attend to (sorted)."""
        lo = self.first_live_index(q_lo)
        anchors = torch.arange(min(self.anchors, lo))
        return torch.cat([anchors, torch.arange(lo, q_hi)])

    def mask(self, q_idx: torch.Tensor, k_idx: torch.Tensor) -> torch.Tensor:
        """[len(q), len(k)] True where query q may attend key k."""
        q, k = q_idx[:, None], k_idx[None, :]
        allowed = k <= q
        if self.window is not None:
            allowed &= (k < self.anchors) | (k > q - self.window)
        return allowed


class TextKVCache:
    """Paged K/V pool for the draft's single attention layer, grown on demand."""

    def __init__(
        self,
        num_kv_heads: int,
        head_dim: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device | str,
        initial_blocks: int = 64,
    ) -> None:
        self.block_size = block_size
        shape = (initial_blocks, block_size, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # [blocks, block, kv_heads, head_dim]
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self._free: list[int] = list(range(initial_blocks - 1, -1, -1))
        self.tables: dict[str, list[int]] = {}  # request -> block ids (FREED where given back)

    # ---- allocation ----------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return self.k.shape[0]

    def _grow(self) -> None:
        old = self.num_blocks
        self.k = torch.cat([self.k, torch.zeros_like(self.k)])
        self.v = torch.cat([self.v, torch.zeros_like(self.v)])
        self._free.extend(range(2 * old - 1, old - 1, -1))

    def _take(self) -> int:
        if not self._free:
            self._grow()
        return self._free.pop()

    def reserve(self, req_id: str, length: int) -> None:
        """Back text indices [0, length) of the request that are not freed with blocks."""
        table = self.tables.setdefault(req_id, [])
        while len(table) * self.block_size < length:
            table.append(self._take())

    def trim(self, req_id: str, spec: WindowSpec, next_query: int) -> None:
        """Give back blocks that no query >= next_query can attend to."""
        table = self.tables.get(req_id)
        if not table:
            return
        live_from = spec.first_live_index(next_query)
        bs = self.block_size
        for b, block in enumerate(table):
            if block == FREED or b * bs < spec.anchors:
                continue
            if (b + 1) * bs > live_from:
                break
            self._free.append(block)
            table[b] = FREED

    def release(self, req_id: str) -> None:
        for block in self.tables.pop(req_id, []):
            if block != FREED:
                self._free.append(block)

    # ---- addressing ----------------------------------------------------------------
    def slots(self, req_id: str, indices: torch.Tensor) -> torch.Tensor:
        """Flat slot (block * block_size + offset) of each text index. indices: [n] (CPU)."""
        table = torch.tensor(self.tables[req_id], dtype=torch.long)
        blocks = table[indices // self.block_size]
        if bool((blocks == FREED).any()):
            raise RuntimeError(f"draft cache: request {req_id} addressed a freed block")
        return blocks * self.block_size + indices % self.block_size

    def write(self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """slots: [n]; k, v: [n, kv_heads, head_dim]."""
        slots = slots.to(self.k.device)
        self.k.view(-1, *self.k.shape[2:])[slots] = k.to(self.k.dtype)
        self.v.view(-1, *self.v.shape[2:])[slots] = v.to(self.v.dtype)

    def read(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        slots = slots.to(self.k.device)
        return self.k.view(-1, *self.k.shape[2:])[slots], self.v.view(-1, *self.v.shape[2:])[slots]

    # ---- accounting ----------------------------------------------------------------
    def blocks_in_use(self, req_id: str | None = None) -> int:
        if req_id is not None:
            return sum(b != FREED for b in self.tables.get(req_id, []))
        return self.num_blocks - len(self._free)

    def bytes_per_block(self) -> int:
        per = self.k[0].numel() * self.k.element_size()
        return 2 * per  # K and V

    def bytes_in_use(self, req_id: str | None = None) -> int:
        return self.blocks_in_use(req_id) * self.bytes_per_block()
