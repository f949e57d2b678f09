"""Exp(1) noise keyed by request, in plain torch (the CPU path and the Triton kernel's reference,
request_noise.py): row b, column v of the noise is a function of (keys[b], v) alone.

The hash: lowbias32 (a 32-bit integer finaliser, two xor-shift-multiply rounds) on int32 tensors,
whose multiplies wrap (two's complement), with the arithmetic right shift masked to a logical
one, so it equals the kernel's uint32 arithmetic bit for bit. The uniform is the hash's top 24
bits, (k + 1/2) / 2^24 in (0, 1), and the noise -log of it: Exp(1) to within the 24-bit grid (as a
float32 uniform gives). Rows are hashed in chunks, so the transient int32 tensors are
[ROWS_PER_CHUNK, vocab] whatever the batch; the output is the caller's [B, vocab] float32 buffer.

    key = row_keys(seeds, positions)          # [B] int32, one per (seed, position)
    col = mix(v ^ SALT)                       # [V]
    noise[b, v] = -log((mix(mix(key[b] ^ col[v]) + key[b]) >> 8) + 1/2) / 2^24)
"""

from __future__ import annotations

import torch

ROWS_PER_CHUNK = 32  # at a 152,064-token vocabulary: 19 MiB per int32 temporary
SALT = 0x5BD1E995  # sets the columns' keys apart from the rows'
MUL1, MUL2 = 0x21F0AAAD, 0x735A2D97  # lowbias32's multipliers (both below 2^31)


def mix32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 of int32 x (wrapping multiplies; `>>` is arithmetic, so its sign bits are masked)."""
    x = x ^ ((x >> 16) & 0xFFFF)
    x = x * MUL1
    x = x ^ ((x >> 15) & 0x1FFFF)
    x = x * MUL2
    return x ^ ((x >> 15) & 0x1FFFF)


def low32(x: torch.Tensor) -> torch.Tensor:
    """The low 32 bits of int64 x as int32 (two's complement)."""
    return (((x & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000).to(torch.int32)


def row_keys(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """int32 [B]: one key per (seed, position); seeds and positions int64 [B]."""
    seed = mix32(low32(seeds) ^ mix32(low32(seeds >> 32)))
    return mix32(seed ^ low32(positions))


def exponential_noise_ref(keys: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Fill out [B, V] float32 with Exp(1) noise: row b, column v from hash(keys[b], v)."""
    cols = mix32(torch.arange(out.shape[1], device=out.device, dtype=torch.int32) ^ SALT)  # [V]
    for start in range(0, out.shape[0], ROWS_PER_CHUNK):
        k = keys[start:start + ROWS_PER_CHUNK, None]  # [b, 1]
        bits = mix32(k ^ cols) + k  # [b, V] int32
        top24 = (mix32(bits) >> 8) & 0xFFFFFF  # [b, V]
        out[start:start + ROWS_PER_CHUNK].copy_(top24).add_(0.5).mul_(2.0 ** -24).log_().neg_()
    return out
