"""Decode throughput against batch size, per method, in one run: does the draft step scale?

    python benchmarks/batch_speed.py [--visual-tokens 512] [--batch-sizes 1,4,16]
                                     [--methods none,sparrow,eagle] [--max-tokens 96] [--out runs/batch]

For each method (one in-process engine each, demo models) and batch size B, B different clips of
the same visual length are submitted together; aggregate decode tok/s = decode tokens of all B
requests / (last token time - first first-token time). Draft ms/step is timed around the
runner's propose(); acceptance from vLLM's counters; outputs are compared with no speculation
at the same batch size. One record per (method, B) is appended to <out>/records.jsonl as it
finishes (a rerun skips those), and <out>/table.md holds speedups over no speculation.
Compare ratios within one run: timings on a shared CPU drift between runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path


def measure(llm, method: str, requests: list[dict], max_tokens: int) -> dict:
    from vllm import SamplingParams

    from vllm_sparrow.bench.engines import draft_timer
    from vllm_sparrow.testing.engine import spec_counters

    spec = method != "none"
    before, t_before = (spec_counters(llm), draft_timer(llm)) if spec else (None, None)
    outs = llm.generate(requests, SamplingParams(temperature=0.0, max_tokens=max_tokens), use_tqdm=False)
    first = min(o.metrics.first_token_ts for o in outs)
    last = max(o.metrics.last_token_ts for o in outs)
    tokens = sum(len(o.outputs[0].token_ids) - 1 for o in outs)
    rec = {"method": method, "batch": len(requests), "decode_tokens": tokens, "decode_s": last - first,
           "decode_tok_s": tokens / (last - first), "outputs": [list(o.outputs[0].token_ids) for o in outs]}
    if spec:
        after, t_after = spec_counters(llm), draft_timer(llm)
        drafts = after["num_drafts"] - before["num_drafts"]
        calls = t_after["calls"] - t_before["calls"]
        rec["acceptance_length"] = 1 + (after["num_accepted_tokens"] - before["num_accepted_tokens"]) / max(drafts, 1)
        rec["draft_ms_per_step"] = 1000 * (t_after["seconds"] - t_before["seconds"]) / max(calls, 1)
    return rec


def table(records: list[dict]) -> str:
    base = {r["batch"]: r for r in records if r["method"] == "none"}
    rows = ["| method | batch | decode tok/s | x no spec | accept len | draft ms/step | = no spec |",
            "|---|---|---|---|---|---|---|"]
    for r in sorted(records, key=lambda r: (r["method"] != "none", r["method"], r["batch"])):
        b = base.get(r["batch"])
        speed = f"{r['decode_tok_s'] / b['decode_tok_s']:.2f}" if b else "-"
        same = "-" if not b or r["method"] == "none" else ("yes" if r["outputs"] == b["outputs"] else "NO")
        acc, ms = r.get("acceptance_length"), r.get("draft_ms_per_step")
        rows.append(f"| {r['method']} | {r['batch']} | {r['decode_tok_s']:.1f} | {speed} | "
                    f"{'-' if acc is None else f'{acc:.2f}'} | {'-' if ms is None else f'{ms:.1f}'} | {same} |")
    return "\n".join(rows) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--visual-tokens", type=int, default=512)
    ap.add_argument("--batch-sizes", default="1,4,16")
    ap.add_argument("--methods", default="none,sparrow,eagle")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--out", default="runs/batch")
    args = ap.parse_args(argv)
    from vllm_sparrow.bench.clips import eval_clips
    from vllm_sparrow.bench.config import BenchConfig
    from vllm_sparrow.bench.engines import close_engine, open_engine
    from vllm_sparrow.testing.tiny_targets import make_prompt
    from vllm_sparrow.video import decode_video

    sizes = [int(x) for x in args.batch_sizes.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = replace(BenchConfig(), lengths=(args.visual_tokens,), max_tokens=args.max_tokens)
    clips = eval_clips(out / "clips", cfg.lengths, max(sizes), cfg.seed0)[args.visual_tokens]
    prompt = make_prompt("qwen2_5_vl", cfg.target, cfg.prompt, media="video")
    requests = [{"prompt": prompt, "multi_modal_data": {"video": decode_video(c.path)}} for c in clips]
    path = out / "records.jsonl"
    done = {(r["method"], r["batch"]): r for r in map(json.loads, path.read_text().splitlines())} if path.exists() else {}
    for method in args.methods.split(","):
        if all((method, b) in done for b in sizes):
            continue
        llm = open_engine(method, cfg, args.visual_tokens, max_num_seqs=max(sizes))
        try:
            measure(llm, method, requests[:1], 16)  # warm-up
            for b in sizes:
                if (method, b) in done:
                    continue
                t0 = time.perf_counter()
                rec = done[(method, b)] = measure(llm, method, requests[:b], args.max_tokens)
                with open(path, "a") as f:
                    f.write(json.dumps(rec) + "\n")
                print(f"[batch_speed] {method} B={b}: {rec['decode_tok_s']:.1f} tok/s "
                      f"({time.perf_counter() - t0:.0f}s)", flush=True)
        finally:
            close_engine(llm)
    text = table(list(done.values()))
    (out / "table.md").write_text(f"{args.visual_tokens} visual tokens, K={cfg.num_speculative_tokens}, greedy, "
                                  f"{args.max_tokens} new tokens per request\n\n" + text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
