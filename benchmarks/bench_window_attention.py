"""Window attention over the paged text cache: Triton kernel vs torch SDPA vs the dense reference.

    python benchmarks/bench_window_attention.py [--batch 1 8 32] [--text 512 4096] [--window 128 512]

Where xformers is installed (the GPU requirements), its memory-efficient attention with a local
causal mask is timed too (no anchors in that mask: checked against the reference with A=0).

One draft step per request (K+1 = 4 query rows at the end of a text run of length L), GQA 28/4
heads of 128 (Qwen2.5-VL-7B shaped). Reports the median time per launch and the effective
bandwidth (bytes of K/V actually read / time) against the device's peak when known. The Triton
kernel needs a GPU: without one this says so and times only the CPU paths (not a speed claim).
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

PEAK_GBPS = {"H200": 4800, "H100": 3350, "A100": 2039, "L40S": 864, "A800": 2039, "L20": 864}


def _inputs(batch, text, rows, heads, kv_heads, d, bs, dtype, dev):
    g = torch.Generator(device="cpu").manual_seed(0)
    blocks_per = (text + bs - 1) // bs
    num_blocks = batch * blocks_per
    k_cache = torch.randn(num_blocks, bs, kv_heads, d, generator=g).to(dtype).to(dev)
    v_cache = torch.randn(num_blocks, bs, kv_heads, d, generator=g).to(dtype).to(dev)
    tables = torch.randperm(num_blocks, generator=g).view(batch, blocks_per).int().to(dev)
    row_req = torch.arange(batch).repeat_interleave(rows).int().to(dev)
    row_pos = torch.arange(text - rows, text).repeat(batch).int().to(dev)
    q = torch.randn(batch * rows, heads, d, generator=g).to(dtype).to(dev)
    return q, k_cache, v_cache, tables, row_req, row_pos


def _sdpa(q, k_cache, v_cache, tables, row_req, row_pos, anchors, window, scale):
    """Gather each request's anchors + window, then one masked SDPA per request (torch path)."""
    bs, kv = k_cache.shape[1], k_cache.shape[2]
    rows = int((row_req == 0).sum())
    out = torch.empty_like(q)
    for r in range(tables.shape[0]):
        pos = row_pos[r * rows : (r + 1) * rows].long()
        lo = max(0, int(pos[0]) - window + 1)
        idx = torch.cat([torch.arange(min(anchors, lo), device=q.device), torch.arange(lo, int(pos[-1]) + 1, device=q.device)])
        slots = tables[r, idx // bs].long() * bs + idx % bs
        k = k_cache.view(-1, kv, k_cache.shape[3])[slots].transpose(0, 1)  # [kv, L, D]
        v = v_cache.view(-1, kv, v_cache.shape[3])[slots].transpose(0, 1)
        mask = (idx[None, :] <= pos[:, None]) & ((idx[None, :] < anchors) | (idx[None, :] > pos[:, None] - window))
        qs = q[r * rows : (r + 1) * rows].transpose(0, 1)  # [H, rows, D]
        group = qs.shape[0] // kv
        o = F.scaled_dot_product_attention(qs, k.repeat_interleave(group, 0), v.repeat_interleave(group, 0),
                                           attn_mask=mask, scale=scale)
        out[r * rows : (r + 1) * rows] = o.transpose(0, 1)
    return out


def _xformers_local(q, k_cache, v_cache, tables, row_req, row_pos, window, scale):
    """xformers' memory-efficient attention with its bottom-right local causal mask: gather each
    request's keys from the pages, then one launch for the batch. The mask has no anchors, so this
    path is checked against the reference with anchors=0 (a GPU speed comparison, optional)."""
    from xformers.ops import fmha

    batch, rows = tables.shape[0], q.shape[0] // tables.shape[0]
    bs, kv, d = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    last = int(row_pos[rows - 1]) + 1  # every request has the same text length in this benchmark
    idx = torch.arange(max(0, last - rows - window + 1), last, device=q.device)  # keys any row can see
    slots = tables[:, idx // bs].long() * bs + idx % bs  # [B, L]
    group = q.shape[1] // kv
    k = k_cache.view(-1, kv, d)[slots].repeat_interleave(group, dim=2)  # [B, L, H, D]
    v = v_cache.view(-1, kv, d)[slots].repeat_interleave(group, dim=2)
    bias = fmha.attn_bias.LowerTriangularFromBottomRightLocalAttentionMask(window)
    out = fmha.memory_efficient_attention(q.view(batch, rows, *q.shape[1:]), k, v, attn_bias=bias, scale=scale)
    return out.reshape(q.shape)


def _have_xformers() -> bool:
    try:
        import xformers.ops  # noqa: F401  (GPU install only: requirements-gpu.txt)
    except Exception:
        return False
    return True


def _time(fn, dev, reps):
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
    return sorted(times)[len(times) // 2]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--text", type=int, nargs="+", default=[512, 4096])
    p.add_argument("--window", type=int, nargs="+", default=[128, 512])
    p.add_argument("--anchors", type=int, default=4)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--json", default=None, help="also write the rows to this file")
    a = p.parse_args()
    gpu = torch.cuda.is_available()
    dev = torch.device("cuda" if gpu else "cpu")
    name = torch.cuda.get_device_name() if gpu else "CPU"
    peak = next((v for k, v in PEAK_GBPS.items() if k in name), None)
    print(f"device: {name}" + ("" if gpu else " -- no GPU here: the Triton kernel is not timed, and CPU "
                                            "numbers say nothing about GPU speed"))
    if gpu and not _have_xformers():
        print("xformers not installed: its local-attention comparison is skipped (pip install xformers)")
    dtype = torch.bfloat16 if gpu else torch.float32
    heads, kv_heads, d, bs, rows = 28, 4, 128, 16, 4
    from vllm_sparrow_kernels.window_attention_ref import window_attention_ref

    results = []
    for batch in a.batch:
        for text in a.text:
            for window in a.window:
                args = _inputs(batch, text, rows, heads, kv_heads, d, bs, dtype, dev)
                keys_read = batch * (min(a.anchors, max(0, text - rows - window + 1)) + window + rows - 1)
                nbytes = 2 * keys_read * kv_heads * d * args[1].element_size()
                scale = d ** -0.5
                row = {"device": name, "batch": batch, "text": text, "window": window}
                paths = {"sdpa": lambda: _sdpa(*args, a.anchors, window, scale)}
                if gpu:
                    from vllm_sparrow_kernels.window_attention import window_attention

                    paths["triton"] = lambda: window_attention(*args, a.anchors, window, scale)
                if gpu and _have_xformers():
                    paths["xformers_local"] = lambda: _xformers_local(*args, window, scale)
                    ref0 = window_attention_ref(*args, 0, window, scale).float()  # its mask: no anchors
                    try:
                        torch.testing.assert_close(paths["xformers_local"]().float(), ref0, atol=3e-2, rtol=3e-2)
                    except AssertionError as e:  # report, do not time a path that computes something else
                        print(f"xformers_local differs from the reference (anchors=0), not timed: {e}")
                        del paths["xformers_local"]
                if batch * text <= 8192:  # the per-row dense reference is slow by design
                    paths["dense_ref"] = lambda: window_attention_ref(*args, a.anchors, window, scale)
                if "dense_ref" in paths:  # time only paths that compute the same thing
                    ref = paths["dense_ref"]().float()
                    for path in ("sdpa", "triton"):
                        if path in paths:
                            torch.testing.assert_close(paths[path]().float(), ref, atol=3e-2, rtol=3e-2)
                for path, fn in paths.items():
                    t = _time(fn, dev, a.reps if path != "dense_ref" else 3)
                    row[f"{path}_ms"] = round(t * 1e3, 4)
                    row[f"{path}_GBps"] = round(nbytes / t / 1e9, 2)
                if peak:
                    row["peak_GBps"] = peak
                results.append(row)
                print(json.dumps(row))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
