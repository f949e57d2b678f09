"""The noise a sampled draft is drawn with (drafting/sampling.py's exponential race), keyed by
request: RequestNoise's draw for request b at chained position j is a function of (b's seed, b's
sequence position + j, the vocabulary column) alone, so a request with a seed drafts the same
tokens on every run, whatever shares its steps, and vLLM's seeded verification then repeats its
output (vLLM 0.34 draws its own drafts so, from a counter-based hash of seed and position).
Without it the draft draws from the engine's generator, whose stream depends on every request
the engine ran before.

The hash: lowbias32 (a 32-bit integer finaliser, two xor-shift-multiply rounds), on int32 tensors
whose multiplies wrap, with the arithmetic right shift masked to a logical one. The uniform is the
hash's top 24 bits, (k + 1/2) / 2^24 in (0, 1), and the noise -log of it: Exp(1) to within the
24-bit grid (as a float32 uniform gives). Rows are hashed in chunks, so the transient int32
tensors are [ROWS_PER_CHUNK, vocab] whatever the batch; the output is the race's one [B, vocab]
float32 buffer.
"""

from __future__ import annotations

import torch

ROWS_PER_CHUNK = 32  # at a 152,064-token vocabulary: 19 MiB per int32 temporary
_SALT = 0x5BD1E995  # sets the columns' keys apart from the rows'


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 of int32 x (wrapping multiplies; `>>` is arithmetic, so its sign bits are masked)."""
    x = x ^ ((x >> 16) & 0xFFFF)
    x = x * 0x21F0AAAD
    x = x ^ ((x >> 15) & 0x1FFFF)
    x = x * 0x735A2D97
    return x ^ ((x >> 15) & 0x1FFFF)


def _low32(x: torch.Tensor) -> torch.Tensor:
    """The low 32 bits of int64 x as int32 (two's complement)."""
    return (((x & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000).to(torch.int32)


def row_keys(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """int32 [B]: one key per (seed, position); seeds and positions int64 [B]."""
    seed = _mix32(_low32(seeds) ^ _mix32(_low32(seeds >> 32)))
    return _mix32(seed ^ _low32(positions))


def exponential_noise(keys: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Fill out [B, V] float32 with Exp(1) noise: row b, column v from hash(keys[b], v)."""
    cols = _mix32(torch.arange(out.shape[1], device=out.device, dtype=torch.int32) ^ _SALT)  # [V]
    for start in range(0, out.shape[0], ROWS_PER_CHUNK):
        k = keys[start:start + ROWS_PER_CHUNK, None]  # [b, 1]
        bits = _mix32(k ^ cols) + k  # [b, V] int32
        top24 = (_mix32(bits) >> 8) & 0xFFFFFF  # [b, V]
        chunk = out[start:start + ROWS_PER_CHUNK]
        chunk.copy_(top24).add_(0.5).mul_(2.0 ** -24).log_().neg_()
    return out


class RequestNoise:
    """Exp(1) noise per request: seeds [B] int64 (vLLM's per-request sampling seeds), positions
    [B] int64 (each request's sequence position at chained position 0). Position j of the chain
    is keyed by positions + j."""

    def __init__(self, seeds: torch.Tensor, positions: torch.Tensor) -> None:
        self.seeds, self.positions = seeds.to(torch.int64), positions.to(torch.int64)

    def exponential(self, like: torch.Tensor, position: int) -> torch.Tensor:
        """Noise shaped like `like` [B, V] for chained position `position`."""
        keys = row_keys(self.seeds[: like.shape[0]], self.positions[: like.shape[0]] + position)
        return exponential_noise(keys, torch.empty_like(like, dtype=torch.float32))
