"""Window attention over the draft's ring cache: the Triton kernels against their torch paths.

    python benchmarks/bench_window_attention.py [--batch 1 16 64] [--chunk 600 3000] [--quick] [--json F]

Two shapes of step, GQA 28/4 heads of 128 (a 7B draft), anchors 4, window 512, a ring that has
wrapped (every request has a long text history):
  decode   B requests x (K + 1) rows: ring_window_attention (Triton) vs its torch reference, and,
           where xformers is installed (the GPU requirements), its memory-efficient attention
           with a local causal mask over each request's gathered window (no anchors: a speed
           reference only);
  mixed    B decodes beside one prompt chunk of P rows, as the drafter runs it: every row stored
           (write_packed_rows), then each request's last entry attended as a [B + 1, 1] commit
           (Triton or torch), against the padded [B + 1, P] layout the drafter used before
           packing (attention for every row).
Every timed path is first checked against the torch reference. Reports the median ms per call.
Without a GPU the Triton kernels are not timed (the interpreter says nothing about speed) and the
CPU numbers say nothing about GPU speed; `--quick` is the suite's smoke size.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

HEADS, KV_HEADS, D, A, W, K = 28, 4, 128, 4, 512, 3


def _cache(slots: int, ring: int, dtype, dev, g):
    shape = (slots + 1, KV_HEADS, A + ring, D)  # + the sink slot
    return torch.randn(shape, generator=g).to(dtype).to(dev), torch.randn(shape, generator=g).to(dtype).to(dev)


def decode_inputs(batch: int, dtype, dev):
    """q/k/v [B, K + 1, heads, D] at the end of a 4k-entry history per request."""
    g = torch.Generator().manual_seed(0)
    ring = W + K
    kc, vc = _cache(batch, ring, dtype, dev, g)
    L = K + 1
    q = torch.randn(batch, L, HEADS, D, generator=g).to(dtype).to(dev)
    k = torch.randn(batch, L, KV_HEADS, D, generator=g).to(dtype).to(dev)
    v = torch.randn(batch, L, KV_HEADS, D, generator=g).to(dtype).to(dev)
    cache_len = torch.full((batch,), 4096, device=dev)
    pos = cache_len[:, None] + torch.arange(L, device=dev)
    valid = torch.ones(batch, L, dtype=torch.bool, device=dev)
    return q, k, v, kc, vc, torch.arange(batch, device=dev), pos, valid, cache_len, ring


def mixed_inputs(batch: int, chunk: int, dtype, dev):
    """Packed rows: B decodes of K + 1 rows, then a fresh prompt chunk of `chunk` rows."""
    g = torch.Generator().manual_seed(1)
    ring = W + K
    kc, vc = _cache(batch + 1, ring, dtype, dev, g)
    lens = [K + 1] * batch + [chunk]
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    N = int(cu[-1])
    q = torch.randn(N, HEADS, D, generator=g).to(dtype).to(dev)
    k = torch.randn(N, KV_HEADS, D, generator=g).to(dtype).to(dev)
    v = torch.randn(N, KV_HEADS, D, generator=g).to(dtype).to(dev)
    cache_len = torch.tensor([4096] * batch + [0], device=dev)
    count = torch.tensor(lens, device=dev)
    return q, k, v, kc, vc, torch.arange(batch + 1, device=dev), cu, cache_len, count, ring


def padded(q, k, v, kc, vc, slots, cu, cache_len, count, ring):
    """The pre-packing layout: every request padded to the longest chunk, [B + 1, P] rows."""
    from vllm_sparrow_kernels.window_attention_ref import ring_window_attention_ref

    lens = np.diff(cu)
    L = int(lens.max())

    def pad(x):
        out = x.new_zeros(len(lens), L, *x.shape[1:])
        for b in range(len(lens)):
            out[b, : lens[b]] = x[cu[b] : cu[b + 1]]
        return out

    pos = cache_len[:, None] + torch.arange(L, device=q.device)
    valid = torch.arange(L, device=q.device)[None, :] < count[:, None]
    out = ring_window_attention_ref(pad(q), pad(k), pad(v), kc, vc, slots, pos, valid, cache_len, A, W, ring,
                                    D ** -0.5)
    return torch.cat([out[b, : lens[b]] for b in range(len(lens))])


def xformers_local(q, k, v, kc, vc, slots, pos, valid, cache_len, ring):
    """xformers' local causal attention over each request's last W - K - 1 cached keys and its own
    rows, gathered in order (anchors left out: a speed reference, not the method)."""
    from xformers.ops import fmha

    B, L = pos.shape
    last = cache_len[:, None] - 1 - torch.arange(W - L, device=q.device).flip(0)  # [B, W - L] text indices
    row = A + torch.remainder(last - A, ring)
    kk = torch.cat([kc[slots[:, None], :, row], k], 1)  # [B, W, kv, D]
    vv = torch.cat([vc[slots[:, None], :, row], v], 1)
    group = HEADS // KV_HEADS
    kk, vv = kk.repeat_interleave(group, 2), vv.repeat_interleave(group, 2)
    bias = fmha.attn_bias.LowerTriangularFromBottomRightLocalAttentionMask(W)
    return fmha.memory_efficient_attention(q, kk, vv, attn_bias=bias, scale=D ** -0.5)


def _time(fn, dev, reps: int) -> float:
    fn()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return 1e3 * sorted(times)[len(times) // 2]


def _fresh(args):
    """A copy of the inputs whose caches each timed call may write."""
    return [a.clone() if isinstance(a, torch.Tensor) else a for a in args]


def bench_decode(batch: int, dtype, dev, reps: int, tol: float) -> dict:
    from vllm_sparrow_kernels.window_attention_ref import ring_window_attention_ref

    args = decode_inputs(batch, dtype, dev)
    q, k, v, kc, vc, slots, pos, valid, cache_len, ring = args
    ref = ring_window_attention_ref(*_fresh(args[:9]), A, W, ring, D ** -0.5)
    row = {"step": "decode", "batch": batch, "rows": int(pos.numel())}
    row["torch_ms"] = _time(lambda: ring_window_attention_ref(*_fresh(args[:9]), A, W, ring, D ** -0.5), dev, reps)
    if dev.type == "cuda":
        from vllm_sparrow_kernels.window_attention import ring_window_attention

        out = ring_window_attention(*_fresh(args[:9]), A, W, ring, D ** -0.5)
        torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)
        row["triton_ms"] = _time(lambda: ring_window_attention(*_fresh(args[:9]), A, W, ring, D ** -0.5), dev, reps)
        if _have_xformers():
            row["xformers_local_ms"] = _time(lambda: xformers_local(*args), dev, reps)
    return row


def packed_step(attention, q, k, v, kc, vc, slots, cu, cache_len, count, ring):
    """The drafter's mixed step: store every real row, then commit each request's last entry
    (its only output that is read) -> [B + 1, 1, heads, D]."""
    from vllm_sparrow_kernels.window_attention_ref import write_packed_rows

    write_packed_rows(kc, vc, k, v, slots, cu, cache_len, count, A, ring)
    last = torch.as_tensor(cu[:-1], device=q.device) + count - 1  # [B + 1] packed row of the last entry
    pos = cache_len + count - 1  # its text index; the cache holds the entries before it
    one = lambda x: x.index_select(0, last)[:, None]  # noqa: E731
    return attention(one(q), one(k), one(v), kc, vc, slots, pos[:, None], torch.ones_like(pos[:, None]).bool(),
                     pos, A, W, ring, D ** -0.5)


def bench_mixed(batch: int, chunk: int, dtype, dev, reps: int, tol: float) -> dict:
    from vllm_sparrow_kernels.window_attention_ref import ring_window_attention_ref

    args = mixed_inputs(batch, chunk, dtype, dev)
    cu, count = args[6], args[8]
    last = torch.as_tensor(cu[:-1], device=dev) + count - 1
    ref = padded(*_fresh(args)).index_select(0, last)[:, None]  # [B + 1, 1, heads, D]
    out = packed_step(ring_window_attention_ref, *_fresh(args))
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)
    row = {"step": "mixed", "batch": batch, "chunk": chunk, "rows": int(cu[-1]), "padded_rows": (batch + 1) * chunk}
    row["torch_packed_ms"] = _time(lambda: packed_step(ring_window_attention_ref, *_fresh(args)), dev, reps)
    row["torch_padded_ms"] = _time(lambda: padded(*_fresh(args)), dev, max(1, reps // 4))
    if dev.type == "cuda":
        from vllm_sparrow_kernels.window_attention import ring_window_attention

        torch.testing.assert_close(packed_step(ring_window_attention, *_fresh(args)).float(), ref.float(),
                                   atol=tol, rtol=tol)
        row["triton_packed_ms"] = _time(lambda: packed_step(ring_window_attention, *_fresh(args)), dev, reps)
    return row


def _have_xformers() -> bool:
    try:
        import xformers.ops  # noqa: F401  (the GPU requirements only)
    except Exception:  # noqa: BLE001 - absent or built for another torch: skip its reference
        return False
    return True


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64])
    p.add_argument("--chunk", type=int, nargs="+", default=[600, 3000])
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--quick", action="store_true", help="smoke size: batch 2, chunk 64, 1 rep")
    p.add_argument("--json", default=None, help="also write the rows to this file")
    a = p.parse_args(argv)
    if a.quick:
        a.batch, a.chunk, a.reps = [2], [64], 1
    gpu = torch.cuda.is_available()
    dev = torch.device("cuda" if gpu else "cpu")
    dtype = torch.bfloat16 if gpu else torch.float32
    tol = 3e-2 if gpu else 1e-4
    name = torch.cuda.get_device_name() if gpu else "CPU"
    print(f"device: {name}" + ("" if gpu else " (no GPU: the Triton kernels are not timed; CPU numbers say "
                                            "nothing about GPU speed)"))
    rows = [bench_decode(b, dtype, dev, a.reps, tol) for b in a.batch]
    rows += [bench_mixed(b, c, dtype, dev, a.reps, tol) for b in a.batch for c in a.chunk]
    for r in rows:
        print("  ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": name, "dtype": str(dtype), "rows": rows}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
