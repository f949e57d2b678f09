"""Would tree verification pay? Chains vs tree search vs trees on held-out clips.

    python benchmarks/tree_replay.py [--world hard|easy] [--models DIR] [--lengths 512,17408] [--clips 4]
                                     [--out runs/tree-replay]

Captures held-out benchmark scenes (the bench's clips, seeds no draft trained on) with the demo
target at each visual length (resumable), then replays, at every verify point of each response,
the shipped Sparrow draft's greedy chains of depth 1..8, its EAGLE-2-style search's best chain,
and trees of N of the search's best nodes verified as tree attention would
(vllm_sparrow/training/tree_replay.py). Writes <out>/results.json (one record per length) and
<out>/tree_replay.md, and prints the table: mean acceptance length (1 + accepted per verify
step) at equal numbers of verified tokens, and the target's mean probability of its own
response tokens (how predictable the captions at that length are, whatever the draft).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world", default="hard", choices=("hard", "easy"))
    ap.add_argument("--models", default=None, help="default: the world's demo models")
    ap.add_argument("--lengths", default="512,17408")
    ap.add_argument("--clips", type=int, default=4)
    ap.add_argument("--topk", type=int, default=4)
    ap.add_argument("--out", default="runs/tree-replay")
    args = ap.parse_args(argv)
    from sparrow_world.bench.clips import eval_clips
    from sparrow_world.bench.config import MODELS, BenchConfig
    from sparrow_world.bench.run import environment
    from vllm_sparrow.checkpoint import load_draft
    from vllm_sparrow.durable import atomic_write_json, atomic_write_text
    from vllm_sparrow.training.capture import CaptureConfig, capture
    from vllm_sparrow.training.shards import ShardReader
    from vllm_sparrow.training.target_runner import HFTarget
    from vllm_sparrow.training.tree_replay import replay_trees

    out, models = Path(args.out), Path(args.models or MODELS[args.world])
    lengths = [int(x) for x in args.lengths.split(",")]
    bench = BenchConfig(world=args.world, target=str(models / "target"), sparrow=str(models / "sparrow"))
    clips = eval_clips(out / "clips", tuple(lengths), args.clips, bench.seed0, args.world)
    target = HFTarget(str(models / "target"))
    draft = load_draft(models / "sparrow")
    nodes = (2, 4, 8, 16, 32)
    rows = ["| visual tokens | verify points | " + " | ".join(f"chain {d}" for d in (2, 4, 8)) + " | search 4 | "
            + " | ".join(f"tree {n}" for n in nodes) + " | target top-1 |", "|---|" + "---|" * (6 + len(nodes))]
    records = []
    for n in lengths:
        data = out / f"data-{n}.jsonl"
        atomic_write_text(data, "".join(json.dumps({"video": str(c.path.resolve()), "prompt": bench.prompt}) + "\n"
                                        for c in clips[n]))
        capture(CaptureConfig(target=str(models / "target"), data=str(data), out=str(out / f"cap-{n}"),
                              num_frames=100_000, max_new_tokens=bench.max_tokens, max_seq_len=1 << 16), progress=True)
        r = replay_trees(draft, target, list(ShardReader(out / f"cap-{n}")), max_depth=8, topk=args.topk, tree_nodes=nodes)
        rows.append(f"| {n} | {r.points} | " + " | ".join(f"{r.tau('chain', d):.2f}" for d in (2, 4, 8))
                    + f" | {r.tau('search', 4):.2f} | " + " | ".join(f"{r.tau('tree', k):.2f}" for k in nodes)
                    + f" | {r.target_top1:.3f} |")
        print(rows[-1], flush=True)
        records.append({"visual_tokens": n, "verify_points": r.points,
                        "chain": {d: r.tau("chain", d) for d in range(1, 9)},
                        "search": {d: r.tau("search", d) for d in range(1, 9)},
                        "tree": {k: r.tau("tree", k) for k in nodes}, "target_top1": r.target_top1})
    text = "\n".join(rows) + "\n"
    atomic_write_json(out / "results.json", {"environment": environment(), "settings": vars(args), "records": records})
    atomic_write_text(out / "tree_replay.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
