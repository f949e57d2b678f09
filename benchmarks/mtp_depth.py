"""Do more MTP stages train the late positions a depth-16 chain reaches? The demo build's draft
clips captured once through the engine, the world's Sparrow draft retrained from that capture
with the build's recipe at several `--mtp-steps` (the build's is 2), each with several seeds, and
replayed on the held-out clips at depth 16 (issue 45: depth past 8).

    python benchmarks/mtp_depth.py [--world hard] [--mtp 2,4,7] [--seeds 0,1] [--k 16] [--out runs/mtp-depth]
    python benchmarks/mtp_depth.py --quick     # smoke size: 8 clips, 10 steps, one seed

A chain's depth-K replay holds every shallower depth's: position i is accepted only after 1..i-1
were, so tokens per step at depth K' <= K is 1 + (accepted at positions 1..K') / drafts. Resumable:
rerun the same command (finished rows are kept; the capture and each training resume). Writes
OUT/results.json and OUT/table.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the demo kit (its clips, recipe and environment record), as a script
SHOWN_DEPTHS = (4, 8, 12, 16)  # the table's tokens-per-step columns (clipped to --k)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world", default="hard", choices=("easy", "hard"), help="whose build: its clips and recipe")
    ap.add_argument("--target", default=None, help="target model folder (default: the world's demo target)")
    ap.add_argument("--mtp", default="2,4,7", help="MTP stages of each row (the build's recipe has 2)")
    ap.add_argument("--seeds", default="0,1", help="training seeds of each row")
    ap.add_argument("--k", type=int, default=16, help="depth of the held-out replay")
    ap.add_argument("--out", default="runs/mtp-depth", help="writes OUT/results.json and OUT/table.md")
    ap.add_argument("--quick", action="store_true", help="smoke size: 8 clips, 10 steps, one seed")
    args = ap.parse_args(argv)
    args.mtp = [int(m) for m in args.mtp.split(",")]
    args.seeds = [int(s) for s in args.seeds.split(",")]
    args.target = args.target or str(ROOT / build_config(args.world).out / "target")
    if args.quick:
        args.seeds = args.seeds[:1]
    return args


def build_config(world: str):
    from sparrow_world.demo.build import DemoBuildConfig, hard_world

    return hard_world() if world == "hard" else DemoBuildConfig()


def recipe(args) -> dict:
    """The world's demo build's Sparrow recipe (its clips and training knobs) replayed at --k,
    smaller under --quick."""
    from sparrow_world.demo.build import draft_knobs
    from sparrow_world.world.languages import language

    b = build_config(args.world)
    knobs = {**draft_knobs(b, "sparrow"), "speculative_tokens": args.k}
    clips = b.draft_clips
    if args.quick:
        knobs |= dict(steps=10, warmup_steps=2, holdout=2, save_every=5)
        clips = {16: 8}
    return {"clips": clips, "train": knobs, "capture_seq_len": b.capture_seq_len, "capture_dtype": b.capture_dtype,
            "prompt": language(args.world).prompt}


def capture_once(args, plan: dict, data: Path, out: Path) -> dict:
    """The build's capture of its draft clips (through the engine, its dtype), Sparrow's states only."""
    from vllm_sparrow.training.capture import CaptureConfig, capture

    start = time.perf_counter()
    capture(CaptureConfig(target=args.target, data=str(data), out=str(out), num_frames=10_000, max_new_tokens=320,
                          shard_size=32, engine=True, store_dtype=plan["capture_dtype"],
                          max_seq_len=plan["capture_seq_len"]), progress=False)
    return {"capture_s": time.perf_counter() - start}


def train_row(capture_dir: Path, run: Path, knobs: dict, mtp: int, seed: int) -> dict:
    from vllm_sparrow.training.train import TrainConfig, train

    start = time.perf_counter()
    res = train(TrainConfig(capture=str(capture_dir), out=str(run), seed=seed, **{**knobs, "mtp_steps": mtp}),
                progress=False)
    est = res.acceptance
    return {"replay": est.mean_acceptance_length, "per_position": est.per_position, "drafts": est.drafts,
            "train_s": time.perf_counter() - start}


def main(argv=None) -> int:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from sparrow_world.bench.run import environment
    from sparrow_world.demo.build import write_clips
    from vllm_sparrow.durable import atomic_write_json, atomic_write_text

    plan = recipe(args)
    data = write_clips(out / "clips", plan["clips"], prompt=plan["prompt"])
    done_path = out / "records.json"  # rows finished so far: a rerun goes on from them
    records = json.loads(done_path.read_text()) if done_path.exists() else []
    cap_path = out / "capture.json"
    if not cap_path.exists():  # the capture itself resumes if killed; its record is written once done
        atomic_write_json(cap_path, capture_once(args, plan, data, out / "capture"))
    for mtp in args.mtp:
        for seed in args.seeds:
            if any(r["mtp_steps"] == mtp and r["seed"] == seed for r in records):
                continue
            row = train_row(out / "capture", out / f"train-mtp{mtp}-seed{seed}", plan["train"], mtp, seed)
            records.append({"mtp_steps": mtp, "seed": seed, **row})
            print(f"[mtp-depth] mtp {mtp} seed {seed}: tokens per step at depth {args.k} {row['replay']:.3f} "
                  f"({row['train_s']:.0f} s)", flush=True)
            atomic_write_text(done_path, json.dumps(records))
    result = {"command_line": "python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *(argv or sys.argv[1:])]),
              "environment": environment(), "settings": {**vars(args), "recipe": plan},
              "capture": json.loads(cap_path.read_text()), "records": records}
    atomic_write_text(out / "results.json", json.dumps(result, indent=1, default=str) + "\n")
    atomic_write_text(out / "table.md", table(result))
    print(table(result) + f"\nMeasured by `{result['command_line']}`.")
    return 0


def tokens_per_step(row: dict, depth: int) -> float:
    """Tokens per step of the chain cut at `depth` (<= the replay's): 1 + accepted at 1..depth per draft."""
    return 1 + sum(row["per_position"][:depth]) / row["drafts"]


def conditional(row: dict, position: int) -> float:
    """Acceptance at `position` (1-based) given the one before it was accepted."""
    pp = row["per_position"]
    before = row["drafts"] if position == 1 else pp[position - 2]
    return pp[position - 1] / before if before else float("nan")


def table(result: dict) -> str:
    """Per MTP setting, over its seeds: tokens per step at depths 4-16 and each late position's
    conditional acceptance (mean over seeds)."""
    k = result["settings"]["k"]
    depths = [d for d in SHOWN_DEPTHS if d <= k]
    late = [p for p in (8, 12, 16) if p <= k]
    head = (["MTP stages", "seeds"] + [f"tokens/step at depth {d}" for d in depths]
            + [f"accept at position {p} (given {p - 1})" for p in late])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for mtp in result["settings"]["mtp"]:
        rows = [r for r in result["records"] if r["mtp_steps"] == mtp]
        if not rows:
            continue
        mean = lambda f: sum(f(r) for r in rows) / len(rows)  # noqa: E731
        lines.append("| " + " | ".join([str(mtp), str(len(rows))]
                                       + [f"{mean(lambda r: tokens_per_step(r, d)):.2f}" for d in depths]
                                       + [f"{mean(lambda r: conditional(r, p)):.3f}" for p in late]) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
