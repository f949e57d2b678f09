"""`sparrow tune` on a copy of a draft: the copy carries what tune chose on this machine (its depth
per batch size and stop threshold), for a benchmark to serve beside fixed depths, while the draft
itself stays as shipped.

    python benchmarks/tuned_draft.py --draft models/world-hard/sparrow --capture CAP --data DATA \\
        [--samples 4] [--batch-sizes 1,4,16] --out runs/published/hard-tune

Writes <out>/draft (the tuned copy: `sparrow bench --ablation tuned=<out>/draft@auto` serves its
schedule) and <out>/results.json (tune's measurements and choice).
"""

from __future__ import annotations

import argparse
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
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    from vllm_sparrow.training.tune import TuneConfig, batch_sizes, tune

    out = Path(args.out)
    copy = out / "draft"
    if copy.exists():
        shutil.rmtree(copy)
    shutil.copytree(args.draft, copy)
    result = tune(TuneConfig(draft=str(copy), capture=args.capture, data=args.data, samples=args.samples,
                             batch_sizes=batch_sizes(args.batch_sizes), write=True, out=str(out / "results.json")))
    print(result.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
