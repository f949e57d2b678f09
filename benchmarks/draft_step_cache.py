"""Why Sparrow's draft step takes longer beside a longer video on a CPU, when its work does not grow.

    python benchmarks/draft_step_cache.py [--models models/world-hard] [--k 5] [--lengths 512,6144,24960]
                                          [--steps 200] [--repeats 3] [--out runs/draft-step-cache]
    python benchmarks/draft_step_cache.py --quick    # smoke size: 20 steps, 1 repeat

The serving drafter (SparrowDrafter, torch attention, batch 1) drafts K tokens a step along one
text stream, the same stream at every length: its text-window cache holds text positions only,
so a video's length changes nothing it computes. What a length does change is what runs
between two draft steps: the target's decode reads its whole KV cache, layers x 2 x kv heads x
head_dim x bytes x tokens (77 MB for the hard demo target at 24,960 visual tokens in float32),
and that stream evicts the draft's weights and cache from the CPU's caches. This script
streams that many bytes through memory (an in-place multiply of a buffer of that size) between
draft steps and times the draft step alone, beside steps with nothing between them, each
length in every repeat. Writes OUT/results.json and OUT/table.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the demo kit (its environment record), when run as a script


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="models/world-hard", help="folder with target/ and sparrow/")
    ap.add_argument("--k", type=int, default=5, help="draft tokens per step")
    ap.add_argument("--lengths", default="512,6144,24960", help="visual tokens whose target KV bytes are streamed")
    ap.add_argument("--steps", type=int, default=200, help="draft steps per measurement")
    ap.add_argument("--repeats", type=int, default=3, help="measurements per length, lengths interleaved")
    ap.add_argument("--out", default="runs/draft-step-cache", help="writes OUT/results.json and OUT/table.md")
    ap.add_argument("--quick", action="store_true", help="smoke size: 20 steps, 1 repeat")
    args = ap.parse_args(argv)
    args.lengths = tuple(int(n) for n in args.lengths.split(",") if n)
    if args.quick:
        args.steps, args.repeats = 20, 1
    return args


def target_kv_bytes_per_token(target_dir: Path) -> int:
    """Bytes of the target's KV cache per token: layers x (K and V) x kv heads x head_dim x dtype."""
    cfg = json.loads((target_dir / "config.json").read_text())
    text = cfg.get("text_config", cfg)
    heads = text["num_attention_heads"]
    head_dim = text.get("head_dim") or text["hidden_size"] // heads
    kv_heads = text.get("num_key_value_heads") or heads
    return text["num_hidden_layers"] * 2 * kv_heads * head_dim * 4  # float32, as the demo serves


@torch.inference_mode()
def draft_step_ms(draft, target, k: int, steps: int, sweep: torch.Tensor | None) -> float:
    """Median ms of one decode draft step (one verified token a step, K drafted), `sweep`
    streamed through memory before each step and not timed."""
    from vllm_sparrow.attention import TorchWindowAttention
    from vllm_sparrow.drafter import SparrowDrafter, StepBatch
    from vllm_sparrow.drafting.chain import CHAIN
    from vllm_sparrow.model import OwnTokenIO

    gen = torch.Generator().manual_seed(0)
    m, prompt = steps + 8, 8
    tokens = torch.randint(draft.cfg.vocab_size, (m,), generator=gen)  # [m] the text stream
    hidden = torch.randn(m, draft.cfg.hidden_size, generator=gen)  # [m, hidden]
    drafter = SparrowDrafter(draft, OwnTokenIO(draft, target), (), TorchWindowAttention(), hidden.device,
                             hidden.dtype, max_requests=1, max_draft_tokens=k, max_text_tokens=m + k + 1)
    times, lo, c = [], 0, prompt
    while c + 1 < m:
        batch = StepBatch.from_lists(["r"], tokens[lo:c], hidden[lo:c], [0], [c - lo], [lo], [prompt],
                                     tokens[c : c + 1], [False])
        if sweep is not None:
            sweep.mul_(1.0)
        start = time.perf_counter()
        CHAIN.step(drafter, batch, k)
        times.append(time.perf_counter() - start)
        lo, c = c, c + 1
    return 1e3 * statistics.median(times[3:])  # the first steps warm up


def measure(args) -> list[dict]:
    from vllm_sparrow.checkpoint import load_draft
    from vllm_sparrow.training.target_runner import HFTarget

    models = Path(args.models)
    target, draft = HFTarget(str(models / "target")), load_draft(models / "sparrow")
    per_token = target_kv_bytes_per_token(models / "target")
    rows = {n: {"visual_tokens": n, "streamed_mb": n * per_token / 1e6, "alone_ms": [], "after_stream_ms": []}
            for n in args.lengths}
    for _ in range(args.repeats):
        for n in args.lengths:
            sweep = torch.zeros(n * per_token // 4)  # float32: the target's KV bytes at n visual tokens
            rows[n]["alone_ms"].append(draft_step_ms(draft, target, args.k, args.steps, None))
            rows[n]["after_stream_ms"].append(draft_step_ms(draft, target, args.k, args.steps, sweep))
            del sweep
    for r in rows.values():
        r["alone_median_ms"] = statistics.median(r["alone_ms"])
        r["after_stream_median_ms"] = statistics.median(r["after_stream_ms"])
        r["ratio"] = r["after_stream_median_ms"] / r["alone_median_ms"]
    return list(rows.values())


def table(result: dict) -> str:
    """The rows as a markdown table (benchmarks/publish.py renders the published one with it)."""
    lines = ["| visual tokens | target KV streamed between steps | draft step alone | after the stream | ratio |",
             "|---|---|---|---|---|"]
    for r in result["records"]:
        lines.append(f"| {r['visual_tokens']:,} | {r['streamed_mb']:.0f} MB | {r['alone_median_ms']:.2f} ms | "
                     f"{r['after_stream_median_ms']:.2f} ms | {r['ratio']:.2f}x |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    from sparrow_world.bench.run import environment
    from vllm_sparrow.durable import atomic_write_json, atomic_write_text

    torch.manual_seed(0)
    result = {"environment": environment(),
              "settings": {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(args).items()},
              "records": measure(args)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "results.json", result, indent=1)
    atomic_write_text(out / "table.md", table(result))
    print(table(result), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
