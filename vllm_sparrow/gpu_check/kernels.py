"""Part 1: the compiled window-attention kernel against its torch reference at the check's
shapes (7B: 28/4 heads of 128, bf16), on batches like the drafter's: requests with long cached
histories that wrapped the ring, a fresh one, padding rows, decode (L = 1) and verify (L = K + 1)
layouts and a longer one (two launches: attention, then the write).

The reference runs in fp32 on the same (rounded) inputs; the kernel's dot products run on
tensor cores in the input dtype with fp32 accumulation, hence the tolerance per dtype. The
cache write must be exact: the kernel stores the inputs it was given.
"""

from __future__ import annotations

import torch

from .shapes import CheckShapes
from .timer import measure_ms

TOLERANCE = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 2e-2}


def ring_batch(s: CheckShapes, B: int, L: int, cached: int, device: torch.device, seed: int):
    """Random slots and histories in a ring cache of the check's window. Request 0 is fresh,
    request 1 (when there are two) has every row valid; the others a random number of valid rows."""
    g = torch.Generator(device=device).manual_seed(seed)
    ring = s.window + s.k + 1
    slots_total = B + 2
    cap = s.anchors + ring
    rand = lambda *shape: torch.randn(*shape, generator=g, device=device).to(s.dtype)  # noqa: E731
    slots = torch.randperm(slots_total, generator=g, device=device)[:B]
    cache_len = torch.randint(0, max(cached, 1) + 1, (B,), generator=g, device=device)
    cache_len[0] = 0
    n_valid = torch.randint(1, L + 1, (B,), generator=g, device=device)
    if B > 1:
        n_valid[1] = L
    pos = cache_len[:, None] + torch.arange(L, device=device)[None, :]  # [B, L]
    valid = torch.arange(L, device=device)[None, :] < n_valid[:, None]  # [B, L]
    shape = (slots_total + 1, s.kv_heads, cap, s.head_dim)  # + the sink slot
    return dict(q=rand(B, L, s.heads, s.head_dim), k=rand(B, L, s.kv_heads, s.head_dim),
                v=rand(B, L, s.kv_heads, s.head_dim), k_cache=rand(*shape), v_cache=rand(*shape), slots=slots,
                pos=pos, valid=valid, cache_len=cache_len, ring=ring)


def check_case(s: CheckShapes, B: int, L: int, cached: int, device: torch.device) -> dict:
    from vllm_sparrow_kernels.window_attention import ring_window_attention
    from vllm_sparrow_kernels.window_attention_ref import ring_window_attention_ref

    x = ring_batch(s, B, L, cached, device, seed=B * 1000 + L)
    kc_ref, vc_ref = x["k_cache"].float(), x["v_cache"].float()
    scale = s.head_dim ** -0.5
    args = (x["slots"], x["pos"], x["valid"], x["cache_len"], s.anchors, s.window, x["ring"], scale)
    out = ring_window_attention(x["q"], x["k"], x["v"], x["k_cache"], x["v_cache"], *args)
    ref = ring_window_attention_ref(x["q"].float(), x["k"].float(), x["v"].float(), kc_ref, vc_ref, *args)
    rows = x["valid"][:, :, None, None].expand_as(out)  # padding rows' outputs are discarded
    err = (out[rows].float() - ref[rows]).abs().max().item() if rows.any() else 0.0
    live = slice(0, x["k_cache"].shape[0] - 1)  # the reference also writes padding to the sink slot
    cache_exact = bool(torch.equal(x["k_cache"][live].float(), kc_ref[live])
                       and torch.equal(x["v_cache"][live].float(), vc_ref[live]))
    tol = TOLERANCE[s.dtype]
    return {"batch": B, "rows": L, "cached": cached, "max_abs_error": err, "tolerance": tol,
            "cache_write_exact": cache_exact, "passed": err <= tol and cache_exact}


def time_kernel(s: CheckShapes, B: int, L: int, cached: int, device: torch.device, repeats: int) -> dict:
    """Kernel and torch reference times (ms) on one case, same dtype (the reference as the torch
    backend would run it: one gather and a masked SDPA)."""
    from vllm_sparrow_kernels.window_attention import ring_window_attention
    from vllm_sparrow_kernels.window_attention_ref import ring_window_attention_ref

    x = ring_batch(s, B, L, cached, device, seed=7)
    args = (x["q"], x["k"], x["v"], x["k_cache"], x["v_cache"], x["slots"], x["pos"], x["valid"], x["cache_len"],
            s.anchors, s.window, x["ring"], s.head_dim ** -0.5)
    return {"batch": B, "rows": L, "cached": cached,
            "kernel_ms": measure_ms(lambda: ring_window_attention(*args), device, repeats),
            "torch_reference_ms": measure_ms(lambda: ring_window_attention_ref(*args), device, repeats)}


def run(s: CheckShapes, device: torch.device) -> dict:
    cases = [check_case(s, B, L, cached, device) for B, L, cached in s.kernel_cases]
    B, L, cached = max(s.kernel_cases)
    return {"cases": cases, "timing": time_kernel(s, B, L, cached, device, s.timing_repeats),
            "passed": all(c["passed"] for c in cases)}
