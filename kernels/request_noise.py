"""Triton kernel: Exp(1) noise keyed by request, one launch per drafted position, no temporaries
(the torch reference, request_noise_ref.py, hashes in row chunks with int32 temporaries).

Same contract and the same hash as request_noise_ref.exponential_noise_ref, in uint32 arithmetic
(wrapping multiplies, logical shifts): equal bits, the noise equal up to the last bit of log.
One program per (row, block of columns). Set TRITON_INTERPRET=1 before importing to run on CPU
(tests).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import request_noise_ref as ref

MUL1, MUL2, SALT = tl.constexpr(ref.MUL1), tl.constexpr(ref.MUL2), tl.constexpr(ref.SALT)


@triton.jit
def _mix32(x):
    """lowbias32 of uint32 x."""
    x = x ^ (x >> 16)
    x = x * MUL1
    x = x ^ (x >> 15)
    x = x * MUL2
    return x ^ (x >> 15)


@triton.jit
def _noise_kernel(keys_ptr, out_ptr, V, stride, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    v = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    key = tl.load(keys_ptr + b).to(tl.uint32, bitcast=True)
    col = _mix32(v.to(tl.uint32) ^ SALT)
    bits = _mix32(key ^ col) + key
    top24 = _mix32(bits) >> 8
    u = (top24.to(tl.float32) + 0.5) * (1.0 / 16777216.0)
    tl.store(out_ptr + b * stride + v, -tl.log(u), mask=v < V)


def exponential_noise(keys: torch.Tensor, out: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """Fill out [B, V] float32 (rows contiguous) with Exp(1) noise from keys [B] int32."""
    assert out.dtype == torch.float32 and out.stride(1) == 1 and keys.dtype == torch.int32
    B, V = out.shape
    if B:
        _noise_kernel[(B, triton.cdiv(V, block))](keys.contiguous(), out, V, out.stride(0), BLOCK=block)
    return out
