"""Capture speed: the transformers capture (one sample at a time) against the engine capture
(`sparrow capture --engine`, batched in vLLM) on the same samples, in one run.

    python benchmarks/capture_speed.py [--target models/world/target] [--frames 16] [--prompts 4]
                                       [--batches 1,8] [--max-new-tokens 256] [--out runs/capture-speed]
    python benchmarks/capture_speed.py --quick     # smoke size: 2 clips x 1 prompt, 4 frames, 16 tokens

Samples: every bundled clip (examples/videos) with each of `--prompts` captioning prompts, no
responses given, so each capture also writes the target's answers (the slow half). Each capture
runs into its own folder in float32 (target and stored states), so states can be compared.
Reported per path: samples/s of the sample loop (model load and engine start-up excluded, and
given apart), the speedup over transformers, and agreement: samples whose tokens (prompt and
answer) equal the transformers capture's, and the largest state difference over the positions
both paths compute alike (visual positions, and text before the first video: after a long video
transformers 5 and vLLM place text at other M-RoPE positions, docs/known-problems.md). Engine
captures of different batch sizes must store the same tokens and states. Writes OUT/results.json
and OUT/table.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the demo kit (its environment record), when run as a script
PROMPTS = ("describe the video .", "describe the video in detail .", "what happens in the video ?",
           "describe the clip .")


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default=str(ROOT / "models/world/target"), help="target model folder")
    ap.add_argument("--videos", default=str(ROOT / "examples/videos"), help="folder of clips (samples.json)")
    ap.add_argument("--frames", type=int, default=16, help="frames per clip")
    ap.add_argument("--prompts", type=int, default=4, help=f"prompts per clip (of {len(PROMPTS)})")
    ap.add_argument("--batches", default="1,8", help="engine batch sizes (samples per engine run)")
    ap.add_argument("--max-new-tokens", type=int, default=256, help="longest answer")
    ap.add_argument("--out", default="runs/capture-speed", help="writes OUT/results.json and OUT/table.md")
    ap.add_argument("--quick", action="store_true", help="smoke size: 2 clips x 1 prompt, 4 frames, 16 tokens")
    args = ap.parse_args(argv)
    args.batches = tuple(int(b) for b in args.batches.split(",") if b)
    args.clips = None
    if args.quick:
        args.frames, args.prompts, args.max_new_tokens, args.clips = 4, 1, 16, 2
    return args


def write_data(args, out: Path) -> Path:
    clips = json.loads((Path(args.videos) / "samples.json").read_text())[: args.clips]
    rows = [{"video": str(Path(args.videos) / c["file"]), "prompt": p} for c in clips for p in PROMPTS[: args.prompts]]
    path = out / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run_capture(args, data: Path, out: Path, batch: int | None) -> dict:
    from vllm_sparrow.training.capture import CaptureConfig, capture

    engine = batch is not None
    cfg = CaptureConfig(target=args.target, data=str(data), out=str(out), num_frames=args.frames,
                        max_new_tokens=args.max_new_tokens, store_dtype="float32",
                        engine=engine, batch=batch or 1, engine_args={"dtype": "float32"} if engine else {})
    start = time.perf_counter()
    report = capture(cfg, progress=False)
    wall = time.perf_counter() - start
    return {"path": f"engine, batch {batch}" if engine else "transformers", "batch": batch, "samples": report.kept,
            "skipped": report.skipped, "loop_s": report.seconds, "wall_s": wall,
            "samples_per_s": report.kept / report.seconds, "start_s": wall - report.seconds}


def agreement(ref_dir: Path, other_dir: Path) -> dict:
    """Samples with equal tokens, and the largest state difference where both compute alike."""
    from vllm_sparrow.training.shards import ShardReader

    same, worst = 0, 0.0
    pairs = list(zip(ShardReader(ref_dir), ShardReader(other_dir)))
    for a, b in pairs:
        if not torch.equal(a["token_ids"], b["token_ids"]):
            continue
        same += 1
        vis = a["is_visual"]
        first_vis = int(vis.nonzero()[0]) if vis.any() else len(vis)
        before = int((~vis[:first_vis]).sum())  # text positions before the video: the first rows of text_hidden
        diffs = [(a["visual_hidden"] - b["visual_hidden"]).abs().max(),
                 (a["text_hidden"][:before] - b["text_hidden"][:before]).abs().max()]
        worst = max(worst, *(float(d) for d in diffs))
    return {"same_tokens": same, "samples": len(pairs), "max_state_diff": worst}


def main(argv=None) -> int:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    args = parse_args(argv)
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"{out} exists: give a new --out (every capture starts empty, or it would resume)")
    out.mkdir(parents=True)
    data = write_data(args, out)
    rows = [run_capture(args, data, out / "transformers", None)]
    for b in args.batches:
        rows.append(run_capture(args, data, out / f"engine-b{b}", b))
    for row in rows[1:]:
        row["speedup"] = row["samples_per_s"] / rows[0]["samples_per_s"]
        row.update({f"vs_transformers_{k}": v for k, v in agreement(out / "transformers", out / f"engine-b{row['batch']}").items()})
        first = out / f"engine-b{args.batches[0]}"
        row.update({f"vs_engine_b{args.batches[0]}_{k}": v for k, v in agreement(first, out / f"engine-b{row['batch']}").items()})
    from sparrow_world.bench.run import environment

    result = {"command_line": "python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *(argv or sys.argv[1:])]),
              "environment": environment(), "settings": vars(args), "records": rows}
    (out / "results.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    (out / "table.md").write_text(table(result))
    print(table(result) + f"\nMeasured by `{result['command_line']}`.")
    return 0


def table(result: dict) -> str:
    """The rows as a markdown table (benchmarks/publish.py renders the published one with it)."""
    first = result["settings"]["batches"][0]
    lines = [f"| path | samples | samples/s | speedup | start-up s | tokens as transformers' | largest state "
             f"difference | as engine batch {first} (tokens, states) |", "|---|---|---|---|---|---|---|---|"]
    for r in result["records"]:
        if "speedup" not in r:
            lines.append(f"| {r['path']} | {r['samples']} | {r['samples_per_s']:.2f} | 1.0x | {r['start_s']:.0f} "
                         "| - | - | - |")
            continue
        b1 = f"vs_engine_b{first}_"
        lines.append(f"| {r['path']} | {r['samples']} | {r['samples_per_s']:.2f} | {r['speedup']:.1f}x | "
                     f"{r['start_s']:.0f} | {r['vs_transformers_same_tokens']}/{r['vs_transformers_samples']} | "
                     f"{r['vs_transformers_max_state_diff']:.1e} | {r[b1 + 'same_tokens']}/{r[b1 + 'samples']}, "
                     f"{r[b1 + 'max_state_diff']:.1e} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
