"""Aten ops and host reads per engine step of the Sparrow drafter, against the batch size.

    python benchmarks/op_count.py [--models models/world] [--batch-sizes 1,4,16] [--k 3]

Runs the demo target with the Sparrow draft in vLLM, counts the ops dispatched inside the
proposer's propose() (TorchDispatchMode) at each batch size (requests submitted together), and
prints one row per batch size for the decode steps (every query at most K + 1 rows): the
count must stay flat as the batch grows, and host reads must be zero. Counts, not times: the
same on any machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="models/world")
    ap.add_argument("--batch-sizes", default="1,4,16")
    ap.add_argument("--k", type=int, default=3)
    args = ap.parse_args(argv)
    from vllm import LLM, SamplingParams

    from vllm_sparrow.testing.op_count import count_draft_ops, draft_op_records
    from vllm_sparrow.testing.tiny_targets import make_prompt

    sizes = [int(x) for x in args.batch_sizes.split(",")]
    target, draft = os.path.join(args.models, "target"), os.path.join(args.models, "sparrow")
    prompts = [make_prompt("qwen2_5_vl", target, f"describe clip number {i}", None) for i in range(max(sizes))]
    llm = LLM(model=target, enforce_eager=True, dtype="float32", max_model_len=4096, max_num_seqs=max(sizes),
              speculative_config={"method": "sparrow", "model": draft, "num_speculative_tokens": args.k})
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    print("| batch | decode steps | aten ops per step | host reads per step |")
    print("|---|---|---|---|")
    for b in sizes:
        count_draft_ops(llm)
        llm.generate(prompts[:b], params, use_tqdm=False)
        rows = [r for r in draft_op_records(llm) if r["batch"] == b and r["max_query"] <= args.k + 1]
        ops = statistics.median(r["ops"] for r in rows) if rows else float("nan")
        reads = statistics.mean(len(r["host_reads"]) for r in rows) if rows else float("nan")
        print(f"| {b} | {len(rows)} | {ops:.0f} | {reads:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
