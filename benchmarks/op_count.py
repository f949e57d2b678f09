"""Aten ops and host reads per engine step of the draft, against the batch size, per method.

    python benchmarks/op_count.py [--models models/world] [--methods sparrow,eagle]
                                  [--batch-sizes 1,4,16] [--k 3] [--out runs/op-count]

Runs the demo target in vLLM with each draft (sparrow, and vLLM's own eagle on the EAGLE
baseline draft), counts the ops dispatched inside the proposer's propose() (TorchDispatchMode)
at each batch size (requests submitted together), and prints one row per method and batch size
for the decode steps (every query at most K + 1 rows). Sparrow's count must stay flat as the
batch grows and its host reads must be zero. Counts, not times: the same on any machine.
Writes <out>/results.json (one record per method and batch size).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # CPU: a fixed KV cache (no start-up free-memory check)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="models/world")
    ap.add_argument("--methods", default="sparrow,eagle")
    ap.add_argument("--batch-sizes", default="1,4,16")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--out", default="runs/op-count")
    args = ap.parse_args(argv)
    from pathlib import Path

    from vllm import LLM, SamplingParams

    from sparrow_world.bench.op_count import count_draft_ops, draft_op_records
    from sparrow_world.bench.run import environment
    from sparrow_world.tiny_targets import make_prompt
    from vllm_sparrow.durable import atomic_write_json

    sizes = [int(x) for x in args.batch_sizes.split(",")]
    target = os.path.join(args.models, "target")
    prompts = [make_prompt("qwen2_5_vl", target, f"describe clip number {i}", None) for i in range(max(sizes))]
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    print("| method | batch | decode steps | aten ops per step | host reads per step |")
    print("|---|---|---|---|---|")
    records = []
    for method in args.methods.split(","):
        spec = {"method": method, "model": os.path.join(args.models, method), "num_speculative_tokens": args.k}
        llm = LLM(model=target, enforce_eager=True, dtype="float32", max_model_len=4096,
                  max_num_seqs=max(sizes), speculative_config=spec)
        for b in sizes:
            count_draft_ops(llm)
            llm.generate(prompts[:b], params, use_tqdm=False)
            rows = [r for r in draft_op_records(llm) if r["batch"] == b and r["max_query"] <= args.k + 1]
            ops = statistics.median(r["ops"] for r in rows) if rows else float("nan")
            reads = statistics.mean(len(r["host_reads"]) for r in rows) if rows else float("nan")
            print(f"| {method} | {b} | {len(rows)} | {ops:.0f} | {reads:.1f} |", flush=True)
            records.append({"method": method, "batch": b, "decode_steps": len(rows), "ops_per_step": ops,
                            "host_reads_per_step": reads})
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "results.json", {"environment": environment(), "settings": vars(args), "records": records})
    return 0


if __name__ == "__main__":
    sys.exit(main())
