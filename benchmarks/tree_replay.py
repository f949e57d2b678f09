"""Would tree verification pay? Chains vs tree search vs trees on held-out clips, at equal verified
tokens, with the costs at which each tree would win.

    python benchmarks/tree_replay.py [--world hard|easy] [--models DIR] [--lengths 512,17408] [--clips 4]
                                     [--chains 8,16,32] [--trees 8,16,32] [--search-depth 8] [--topk 4]
                                     [--temperature 0.7] [--out runs/tree-replay]

Captures held-out benchmark scenes (the bench's clips, seeds no draft trained on) with the demo
target at each visual length (resumable), then replays, at every verify point of each response,
the shipped Sparrow draft's greedy chains up to the deepest of --chains, its EAGLE-2-style search
(--search-depth levels, --topk children a node) and trees of N of the search's best nodes verified
as tree attention would, greedy and sampled at --temperature by sample-and-match along the captured
path (a lower bound for chains and trees alike: vllm_sparrow/training/tree_replay.py).

The verdict rule (training/depth.py, tree_verdict): a plan that verifies N tokens after D
sequential draft forwards reaches tau tokens per step, so tau / (1 + N v + D d) per unit of step
cost, with v one more verified token and d one more draft forward, both relative to a one-token
step of the target; a chain of k has N = D = k, a tree of N nodes D = --search-depth. A tree pays
where it beats the best chain (any depth up to the deepest of --chains) at the machine's v and d;
for each tree and each d of --draft-costs the table gives the break-even v below which it wins.

Writes <out>/results.json (one record per length) and <out>/tree_replay.md, and prints the tables.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DRAFT_COSTS = (0.05, 0.1, 0.2)  # d: a one-layer draft forward and its LM head per one-token 7B step (drafter-cost note: ~0.1)


def ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world", default="hard", choices=("hard", "easy"))
    ap.add_argument("--models", default=None, help="default: the world's demo models")
    ap.add_argument("--lengths", default="512,17408")
    ap.add_argument("--clips", type=int, default=4)
    ap.add_argument("--chains", default="8,16,32", help="chain depths in the tables (every depth to the deepest is replayed)")
    ap.add_argument("--trees", default="8,16,32", help="tree sizes (nodes verified)")
    ap.add_argument("--search-depth", type=int, default=8, help="levels of the search the trees come from")
    ap.add_argument("--topk", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=0.7, help="the sampled case (0: greedy only)")
    ap.add_argument("--draft-costs", default=",".join(map(str, DRAFT_COSTS)), help="d values of the break-even table")
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
    lengths, chains, trees = ints(args.lengths), ints(args.chains), ints(args.trees)
    costs = tuple(float(x) for x in args.draft_costs.split(","))
    bench = BenchConfig(world=args.world, target=str(models / "target"), sparrow=str(models / "sparrow"))
    clips = eval_clips(out / "clips", lengths, args.clips, bench.seed0, args.world)
    target = HFTarget(str(models / "target"))
    draft = load_draft(models / "sparrow")
    records = []
    for n in lengths:
        data = out / f"data-{n}.jsonl"
        atomic_write_text(data, "".join(json.dumps({"video": str(c.path.resolve()), "prompt": bench.prompt}) + "\n"
                                        for c in clips[n]))
        capture(CaptureConfig(target=str(models / "target"), data=str(data), out=str(out / f"cap-{n}"),
                              num_frames=100_000, max_new_tokens=bench.max_tokens, max_seq_len=1 << 16), progress=True)
        r = replay_trees(draft, target, list(ShardReader(out / f"cap-{n}")), max_depth=max(chains), topk=args.topk,
                         tree_nodes=trees, search_depth=args.search_depth, temperature=args.temperature or None)
        records.append(record(n, r, chains, trees, costs))
        print(json.dumps({k: records[-1][k] for k in ("visual_tokens", "chain", "tree")}), flush=True)
    text = tables(records, chains, trees, costs, args)
    atomic_write_json(out / "results.json", {"environment": environment(), "settings": vars(args), "records": records})
    atomic_write_text(out / "tree_replay.md", text)
    print(text)
    return 0


def record(length: int, r, chains, trees, costs) -> dict:
    """One length's taus (every chain depth, the search's best path, each tree; greedy and
    sampled) and each tree's break-even v at each d, greedy."""
    from vllm_sparrow.training.depth import tree_verdict

    greedy = {"chain": {d: r.tau("chain", d) for d in sorted(r.chain)},
              "search": {d: r.tau("search", d) for d in sorted(r.search)},
              "tree": {k: r.tau("tree", k) for k in trees}}
    rec = {"visual_tokens": length, "verify_points": r.points, "search_depth": r.search_depth,
           "target_top1": r.target_top1, **greedy}
    if r.temperature is not None:
        rec["sampled"] = {"temperature": r.temperature,
                          "chain": {d: r.tau("sampled_chain", d) for d in sorted(r.sampled_chain)},
                          "tree": {k: r.tau("sampled_tree", k) for k in trees}}
    tree_plans = {k: (greedy["tree"][k], r.search_depth) for k in trees}  # a tree of N: search_depth forwards
    rec["break_even_v"] = {str(d): tree_verdict(greedy["chain"], tree_plans, d, 0.0).break_even_v for d in costs}
    return rec


def tables(records: list[dict], chains, trees, costs, args) -> str:
    head = ["| visual tokens | verify points | " + " | ".join(f"chain {d}" for d in chains) + " | "
            + " | ".join(f"tree {n}" for n in trees) + " | target top-1 |",
            "|---|---|" + "---|" * (len(chains) + len(trees) + 1)]
    greedy = [f"| {r['visual_tokens']:,} | {r['verify_points']} | "
              + " | ".join(f"{r['chain'][d]:.2f}" for d in chains) + " | "
              + " | ".join(f"{r['tree'][n]:.2f}" for n in trees) + f" | {r['target_top1']:.3f} |"
              for r in records]
    out = ["Greedy: mean acceptance length (bonus token included), chains of k and trees of N nodes "
           f"(from a {args.search_depth}-level search, top-{args.topk})", "", *head, *greedy]
    if all("sampled" in r for r in records):
        sampled = [f"| {r['visual_tokens']:,} | {r['verify_points']} | "
                   + " | ".join(f"{r['sampled']['chain'][d]:.2f}" for d in chains) + " | "
                   + " | ".join(f"{r['sampled']['tree'][n]:.2f}" for n in trees) + f" | {r['target_top1']:.3f} |"
                   for r in records]
        out += ["", f"Sampled at T = {args.temperature} (sample-and-match along the captured path; lower bounds)", "",
                *head, *sampled]
    out += ["", "Break-even v (one more verified token, relative to a one-token step) below which each tree beats "
            f"every chain of depth 1-{max(chains)} (greedy), at draft forward cost d", "",
            "| visual tokens | d | " + " | ".join(f"tree {n}" for n in trees) + " |",
            "|---|---|" + "---|" * len(trees)]
    for r in records:
        for d in costs:
            cells = [("never" if v is None else f"{v:.3f}") for v in (r["break_even_v"][str(d)][n] for n in trees)]
            out.append(f"| {r['visual_tokens']:,} | {d} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
