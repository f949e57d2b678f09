"""`sparrow tune` on a copy of a draft: the copy carries what tune chose on this machine (its depth
per batch size and stop threshold), for a benchmark to serve beside fixed depths, while the draft
itself stays as shipped.

    python benchmarks/tuned_draft.py --draft models/world-hard/sparrow --capture CAP --data DATA \\
        [--samples 4] [--batch-sizes 1,4,16] --out runs/published/hard-tune

Writes <out>/draft (the tuned copy: `sparrow bench --ablation tuned=<out>/draft@auto` serves its
schedule) and <out>/results.json (tune's measurements and choice).

Tune times the engine that will serve the copy: `sparrow bench`'s (its dtype, float32 on the
demo models, and its graph setting: eager on CPU), not vLLM's defaults. The costs differ by
engine, not only by machine: on this CPU (AMX), with 16 requests of 6,144 visual tokens, one
more verified token a request cost a bfloat16 compiled target about 0.1 ms a step and a float32
eager one about 0.8 ms, so a schedule tuned on the one is wrong for the other.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--draft", required=True)
    ap.add_argument("--capture", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--batch-sizes", default="1,4,16")
    ap.add_argument("--visual-tokens", type=int, default=6144,
                    help="the capture's visual tokens a video: sizes the engine's budget as the bench does")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    from sparrow_world.bench.config import BenchConfig
    from sparrow_world.bench.engines import enforce_eager, token_budget
    from vllm_sparrow.training.tune import TuneConfig, batch_sizes, tune

    # the bench's fixed KV cache on the CPU build (engines.open_engine): with vLLM's default a
    # second engine in one process asks for 0.92 of the memory free, which the first one's leftovers deny
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    bench = BenchConfig()
    # the engine bench serves it in; tune times the capture's whole videos (its frames), so the
    # engine's token budget must hold a batch of them, as the bench's does (engines.open_engine)
    sizes = batch_sizes(args.batch_sizes)
    serving = {"dtype": bench.dtype, "enforce_eager": enforce_eager(bench),
               **token_budget(bench, args.visual_tokens, max(sizes))}

    out = Path(args.out)
    copy = out / "draft"
    if copy.exists():
        shutil.rmtree(copy)
    shutil.copytree(args.draft, copy)
    result = tune(TuneConfig(draft=str(copy), capture=args.capture, data=args.data, samples=args.samples,
                             batch_sizes=sizes, write=True, out=str(out / "results.json"),
                             engine_args=serving))
    print(result.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
