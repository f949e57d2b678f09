"""Part 1: the compiled window-attention kernel on the layouts serving launches, against its torch
reference, at the check's shapes (7B: 28/4 heads of 128).

Serving launches [B, 1] layouts only (drafter.commit_rows and _commit_packed attend each request's
last entry alone; every chained forward is one row per request): row b at text index
pos = cache_len[b], reading the slot's ring. So the cases are batches of B = 1, 64, 256 such rows
whose slots hold every kind of history: fresh (nothing cached), short (anchors only), filling,
exactly full, and wrapped many times (histories up to `kernel_history` entries), with padding
rows (valid False: a request that does not draft) among them. No request is forced fresh.

Judged twice per case:
  fp32   the kernel's IEEE path against the fp32 reference: max error <= 1e-5 (a key too many or
         too few, or a ring row read for the wrong index, moves an output by ~1e-3 or more)
  dtype  (bf16 at 7B) the kernel against the fp32 reference on the same rounded inputs: its error
         may be at most twice that of the torch path run in the same dtype (SDPA), so a one-key
         mask error (~2e-3 over ~520 keys) is not hidden under a loose absolute tolerance
The cache write must be exact in both (the kernel stores what it was given).
Then the kernel is timed on the layouts serving launches, against the torch path (one gather and
a masked SDPA) and xformers' memory-efficient attention where it is installed.
"""

from __future__ import annotations

import torch

from .shapes import CheckShapes
from .timer import measure_ms

FP32_TOLERANCE = 1e-5
DTYPE_ERROR_RATIO = 2.0  # the kernel's error in the model dtype, at most this times torch's
DTYPE_ERROR_FLOOR = 1e-4  # below this, both paths agree with the reference to the dtype's rounding


def histories(s: CheckShapes, B: int, g: torch.Generator, device) -> torch.Tensor:
    """[B] entries each request's slot holds before the step: every kind of slot (a long, wrapped
    history first: a batch of one is a request deep in its answer), then random ones up to
    kernel_history (mostly wrapped)."""
    A, cap = s.anchors, s.anchors + s.window + s.k
    kinds = [s.kernel_history, 2 * cap + 3, cap + 1, cap, cap - 1, A + 1, A, A - 1, 1, 0]
    rand = torch.randint(0, s.kernel_history + 1, (B,), generator=g, device=device)
    fixed = torch.tensor(kinds[:B], device=device)
    return torch.cat([fixed, rand[len(fixed):]])[torch.randperm(B, generator=g, device=device)]


def served_batch(s: CheckShapes, B: int, dtype: torch.dtype, device, seed: int) -> dict:
    """A [B, 1] layout as serving launches it: random slots of a ring cache of the check's
    window, row b at text index cache_len[b], about one row in eight padding."""
    g = torch.Generator(device=device).manual_seed(seed)
    ring = s.window + s.k
    slots_total = B + 2
    cap = s.anchors + ring
    rand = lambda *shape: torch.randn(*shape, generator=g, device=device).to(dtype)  # noqa: E731
    slots = torch.randperm(slots_total, generator=g, device=device)[:B]
    cache_len = histories(s, B, g, device)
    valid = torch.rand(B, 1, generator=g, device=device) > 0.125
    valid[0] = True
    shape = (slots_total + 1, s.kv_heads, cap, s.head_dim)  # + the sink slot
    return dict(q=rand(B, 1, s.heads, s.head_dim), k=rand(B, 1, s.kv_heads, s.head_dim),
                v=rand(B, 1, s.kv_heads, s.head_dim), k_cache=rand(*shape), v_cache=rand(*shape), slots=slots,
                pos=cache_len[:, None].clone(), valid=valid, cache_len=cache_len, ring=ring)


def _args(s: CheckShapes, x: dict, cast=None):
    c = (lambda t: t) if cast is None else cast
    return (c(x["q"]), c(x["k"]), c(x["v"]), c(x["k_cache"]), c(x["v_cache"]), x["slots"], x["pos"], x["valid"],
            x["cache_len"], s.anchors, s.window, x["ring"], s.head_dim ** -0.5)


def _error(out: torch.Tensor, ref: torch.Tensor, valid: torch.Tensor) -> float:
    rows = valid[:, :, None, None].expand_as(out)  # padding rows' outputs are discarded
    return (out[rows].float() - ref[rows]).abs().max().item() if rows.any() else 0.0


def _cache_exact(x: dict, k_ref: torch.Tensor, v_ref: torch.Tensor) -> bool:
    live = slice(0, x["k_cache"].shape[0] - 1)  # the reference also writes padding to the sink slot
    return bool(torch.equal(x["k_cache"][live].float(), k_ref[live].float())
                and torch.equal(x["v_cache"][live].float(), v_ref[live].float()))


def check_case(s: CheckShapes, B: int, dtype: torch.dtype, device) -> dict:
    from vllm_sparrow_kernels.window_attention import ring_window_attention
    from vllm_sparrow_kernels.window_attention_ref import ring_window_attention_ref

    x = served_batch(s, B, dtype, device, seed=B * 7 + (dtype == torch.float32))
    # fp32 copies (copy=True: .float() of an fp32 tensor is the tensor itself, and the reference
    # writes its caches)
    ref_x = {n: (t.to(torch.float32, copy=True) if t.is_floating_point() else t) for n, t in x.items()
             if isinstance(t, torch.Tensor)}
    ref_x["ring"] = x["ring"]
    ref = ring_window_attention_ref(*_args(s, ref_x))  # fp32, writes ref_x's caches
    case = {"batch": B, "rows": 1, "dtype": str(dtype).replace("torch.", ""),
            "histories": sorted({int(c) for c in x["cache_len"].tolist()})[:12],
            "wrapped_slots": int((x["cache_len"] > s.anchors + x["ring"]).sum()),
            "padding_rows": int((~x["valid"]).sum())}
    if dtype != torch.float32:  # the torch path in the same dtype: what bf16 costs any implementation
        torch_x = {**x, "k_cache": x["k_cache"].clone(), "v_cache": x["v_cache"].clone()}
        case["torch_error"] = _error(ring_window_attention_ref(*_args(s, torch_x)), ref, x["valid"])
    out = ring_window_attention(*_args(s, x))
    case["max_abs_error"] = err = _error(out, ref, x["valid"])
    case["cache_write_exact"] = exact = _cache_exact(x, ref_x["k_cache"], ref_x["v_cache"])
    if dtype == torch.float32:
        case["tolerance"] = FP32_TOLERANCE
    else:
        case["tolerance"] = max(DTYPE_ERROR_RATIO * case["torch_error"], DTYPE_ERROR_FLOOR)
    case["passed"] = exact and err <= case["tolerance"]
    return case


def time_layout(s: CheckShapes, B: int, device, repeats: int) -> dict:
    """ms of one [B, 1] attention (the layout serving launches) in the model's dtype: the kernel,
    the torch path, and xformers where installed."""
    from vllm_sparrow_kernels.window_attention import ring_window_attention
    from vllm_sparrow_kernels.window_attention_ref import ring_window_attention_ref

    x = served_batch(s, B, s.dtype, device, seed=99)
    args = _args(s, x)
    row = {"batch": B, "rows": 1, "dtype": str(s.dtype).replace("torch.", ""),
           "kernel_ms": measure_ms(lambda: ring_window_attention(*args), device, repeats),
           "torch_ms": measure_ms(lambda: ring_window_attention_ref(*args), device, repeats)}
    row["xformers_ms"] = _time_xformers(s, x, device, repeats)
    return row


def _time_xformers(s: CheckShapes, x: dict, device, repeats: int):
    """xformers' memory-efficient attention over the gathered slot rows with the window as a bias
    (a dense [B, G, H, 1, A + R + 1] bias: what a user without our kernel would write), or why not."""
    try:
        import xformers.ops as xops
    except ImportError:
        return "xformers not installed"
    from vllm_sparrow_kernels.window_attention_ref import ring_key_mask

    B, G = x["q"].shape[0], s.kv_heads
    H = s.heads // G

    def run():
        kc, vc = x["k_cache"].index_select(0, x["slots"]), x["v_cache"].index_select(0, x["slots"])  # [B, kv, S, D]
        keys = torch.cat([kc, x["k"].transpose(1, 2)], 2).transpose(1, 2)  # [B, S + 1, kv, D]
        values = torch.cat([vc, x["v"].transpose(1, 2)], 2).transpose(1, 2)
        mask = ring_key_mask(x["pos"], x["valid"], x["cache_len"], s.anchors, s.window, x["ring"])  # [B, 1, S + 1]
        bias = torch.zeros(mask.shape, dtype=x["q"].dtype, device=device).masked_fill_(~mask, float("-inf"))
        S1 = keys.shape[1]
        return xops.memory_efficient_attention(
            x["q"].view(B, 1, G, H, s.head_dim), keys[:, :, :, None].expand(B, S1, G, H, s.head_dim),
            values[:, :, :, None].expand(B, S1, G, H, s.head_dim),
            attn_bias=bias[:, None, None].expand(B, G, H, 1, S1))

    try:
        return measure_ms(run, device, repeats)
    except Exception as e:  # an op this device or version does not run: said, not fatal
        return f"not run: {type(e).__name__}: {str(e)[:160]}"


def run(s: CheckShapes, device: torch.device) -> dict:
    dtypes = list(dict.fromkeys([torch.float32, s.dtype]))
    cases = [check_case(s, B, dtype, device) for dtype in dtypes for B in s.kernel_batches]
    timing = [time_layout(s, B, device, s.timing_repeats) for B in s.kernel_timing_batches]
    return {"cases": cases, "timing": timing, "passed": all(c["passed"] for c in cases)}
