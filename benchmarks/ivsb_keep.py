"""What `--ivsb-keep` costs in held-out acceptance: the demo build's draft clips captured through
the engine (bf16 states) keeping a share F of each sample's IVSB visual states, the demo Sparrow
draft retrained from each capture with the demo build's recipe (sparrow_world/demo/build.py),
each with several seeds, and replayed on the held-out clips at K = 3.

    python benchmarks/ivsb_keep.py [--world easy|hard] [--keeps 1,0.25,0.1] [--seeds 0,1] [--out runs/ivsb-keep]
    python benchmarks/ivsb_keep.py --quick     # smoke size: 8 clips, 10 steps, one seed

--world picks the world's build (its target, draft clips, capture dtype and recipe: easy, the
default, or hard, whose draft clips include long videos).

A row "off" trains the same draft from the F = 1 capture with IVSB off (`--no-ivsb`): the floor
that says how much IVSB itself moves acceptance on this world. Replays only read the held-out
clips' text states, which every F stores whole, so the rows differ only in what training saw.
Resumable: rerun the same command (finished rows are kept, captures and training resume).
Writes OUT/results.json and OUT/table.md.
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
OFF = "off"


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world", default="easy", choices=("easy", "hard"), help="whose build: its clips and recipe")
    ap.add_argument("--target", default=None, help="target model folder (default: the world's demo target)")
    ap.add_argument("--keeps", default="1,0.25,0.1", help="shares of visual positions whose IVSB states are stored")
    ap.add_argument("--seeds", default="0,1", help="training seeds of each row")
    ap.add_argument("--k", type=int, default=3, help="depth of the held-out replay")
    ap.add_argument("--out", default="runs/ivsb-keep", help="writes OUT/results.json and OUT/table.md")
    ap.add_argument("--quick", action="store_true", help="smoke size: 8 clips, 10 steps, one seed")
    args = ap.parse_args(argv)
    args.keeps = [float(k) for k in args.keeps.split(",")]
    args.target = args.target or str(ROOT / build_config(args.world).out / "target")
    args.seeds = [int(s) for s in args.seeds.split(",")]
    if args.quick:
        args.seeds = args.seeds[:1]
    if 1.0 not in args.keeps:
        ap.error("--keeps must include 1 (the reference, and the capture the IVSB-off row trains from)")
    return args


def build_config(world: str):
    from sparrow_world.demo.build import DemoBuildConfig, hard_world

    return hard_world() if world == "hard" else DemoBuildConfig()


def recipe(args) -> dict:
    """The world's demo build's Sparrow recipe (its clips and training knobs), smaller under --quick."""
    from sparrow_world.demo.build import draft_knobs

    b = build_config(args.world)
    knobs = {**draft_knobs(b, "sparrow"), "speculative_tokens": args.k}  # the replay's depth
    clips = b.draft_clips
    if args.quick:
        knobs |= dict(steps=10, warmup_steps=2, holdout=2, save_every=5)
        clips = {16: 8}
    return {"clips": clips, "train": knobs, "capture_seq_len": b.capture_seq_len, "prompt": _prompt(args.world)}


def _prompt(world: str) -> str:
    from sparrow_world.world.languages import language

    return language(world).prompt


def capture_at(args, plan: dict, data: Path, out: Path, keep: float) -> dict:
    from vllm_sparrow.training.capture import CaptureConfig, capture

    start = time.perf_counter()
    capture(CaptureConfig(target=args.target, data=str(data), out=str(out), num_frames=10_000, max_new_tokens=320,
                          shard_size=32, engine=True, batch=32, ivsb_keep=keep,  # bf16 states, as a server computes
                          max_seq_len=plan["capture_seq_len"]), progress=False)
    size = sum(f.stat().st_size for f in out.glob("shard-*"))
    return {"capture_bytes": size, "capture_s": time.perf_counter() - start}


def train_from(capture_dir: Path, run: Path, knobs: dict, seed: int, ivsb: bool) -> dict:
    from vllm_sparrow.training.train import TrainConfig, train

    start = time.perf_counter()
    res = train(TrainConfig(capture=str(capture_dir), out=str(run), seed=seed, ivsb=ivsb, **knobs), progress=False)
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
    from vllm_sparrow.durable import atomic_write_text

    plan = recipe(args)
    data = write_clips(out / "clips", plan["clips"], prompt=plan["prompt"])
    done_path = out / "records.json"  # rows finished so far: a rerun goes on from them
    records = json.loads(done_path.read_text()) if done_path.exists() else []
    captures = {}
    for keep in [*args.keeps, OFF]:
        cap_keep = 1.0 if keep == OFF else keep
        if cap_keep not in captures:
            captures[cap_keep] = capture_at(args, plan, data, out / f"capture-{cap_keep:g}", cap_keep)
        for seed in args.seeds:
            if any(r["keep"] == keep and r["seed"] == seed for r in records):
                continue
            row = train_from(out / f"capture-{cap_keep:g}", out / f"train-{keep}-seed{seed}", plan["train"], seed,
                             ivsb=keep != OFF)
            records.append({"keep": keep, "seed": seed, **captures[cap_keep], **row})
            print(f"[ivsb-keep] keep {keep} seed {seed}: replay {row['replay']:.3f}", flush=True)
            atomic_write_text(done_path, json.dumps(records))
    settings = {**vars(args), "recipe": plan}
    result = {"command_line": "python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *(argv or sys.argv[1:])]),
              "environment": environment(), "settings": settings, "records": records}
    atomic_write_text(out / "results.json", json.dumps(result, indent=1, default=str) + "\n")
    atomic_write_text(out / "table.md", table(result))
    print(table(result) + f"\nMeasured by `{result['command_line']}`.")
    return 0


def table(result: dict) -> str:
    """Mean held-out acceptance of each kept share over the seeds (each seed's in brackets)."""
    lines = ["| IVSB states stored | capture MiB | held-out acceptance length (mean) | per seed |", "|---|---|---|---|"]
    for keep in [*result["settings"]["keeps"], OFF]:
        rows = sorted((r for r in result["records"] if r["keep"] == keep), key=lambda r: r["seed"])
        if not rows:
            continue
        label = "none (IVSB off, F = 1 capture)" if keep == OFF else f"F = {keep:g}"
        mean = sum(r["replay"] for r in rows) / len(rows)
        each = ", ".join(f"{r['replay']:.2f}" for r in rows)
        lines.append(f"| {label} | {rows[0]['capture_bytes'] / 2**20:.1f} | {mean:.2f} | {each} (seeds "
                     f"{', '.join(str(r['seed']) for r in rows)}) |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
