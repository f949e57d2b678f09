"""`sparrow demo` and `sparrow bench`: the kit's commands, added to the product's `sparrow` CLI
through the `vllm_sparrow.commands` entry point (setup.py)."""

from __future__ import annotations

import argparse
import os
from dataclasses import replace
from pathlib import Path


def _demo(args) -> int:
    """run: caption the bundled clips with the shipped demo models, without and with sparrow;
    build: retrain those models from scratch; samples: rewrite the bundled clips."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from .demo import run_demo
    from .demo.build import DemoBuildConfig, hard_world
    from .paths import in_checkout

    world = hard_world() if args.world == "hard" else DemoBuildConfig()
    args.models = in_checkout(args.models or world.out)  # the shipped models, from any folder
    args.workdir = args.workdir or world.work
    if args.action == "samples":
        run_demo.write_samples()
        print(f"wrote {run_demo.SAMPLES}")
        return 0
    if args.action == "card":
        from .demo.model_card import write_card

        print(f"wrote {write_card(Path(args.models), Path(args.workdir), Path(args.bench) if args.bench else None)}")
        return 0
    if args.action == "build":
        from .demo.build import build

        cfg = world
        cfg.out, cfg.work, cfg.drafts_only = str(args.models), args.workdir, args.drafts_only
        cfg.target_from = args.target_from or cfg.target_from
        cfg.stages = args.stages or cfg.stages
        target = cfg.target
        if args.target_minutes is not None:
            target.minutes = args.target_minutes
        if args.extension_minutes is not None:
            target.extension = replace(target.extension, minutes=args.extension_minutes)
        if args.long_steps is not None:
            target.long = replace(target.long, steps=args.long_steps)
        if args.threads is not None:
            target.threads = args.threads
        for name, path in build(cfg).items():
            print(f"{name}: {path}")
        return 0
    return run_demo.run_demo(Path(args.models), max_tokens=args.max_tokens or world.caption_tokens,
                             log=None if args.log in ("", "-") else Path(args.log), world=world.world)


def bench_config(args, ablations: dict | None = None):
    """The BenchConfig of parsed `sparrow bench` options; --quick sets only the sizes the command
    line left out (an explicit --batch-sizes, --lengths or --clips is kept)."""
    from vllm_sparrow.knobs import from_args

    from .bench.config import QUICK, BenchConfig, quick

    given = tuple(k for k in QUICK if getattr(args, k, None) is not None)
    values = argparse.Namespace(**{k: v for k, v in vars(args).items() if k not in QUICK or k in given})
    cfg = from_args(BenchConfig, values, ablations=ablations or {})
    return quick(cfg, keep=given) if args.quick else cfg


def bench_from_args(args):
    """The BenchConfig of `sparrow bench`'s options, --ablation and --with-ablations included."""
    ablations = dict(a.split("=", 1) for a in args.ablation)
    cfg = bench_config(args, ablations)  # resolves the world's default draft folders
    if args.with_ablations:  # every draft under <sparrow>/../ablations (what `sparrow demo build` writes)
        folder = Path(cfg.sparrow).parent / "ablations"
        found = {d.name: str(d) for d in sorted(folder.iterdir()) if (d / "config.json").exists()}
        cfg = bench_config(args, {**found, **ablations})
    return cfg


def _bench(args) -> int:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from .bench.run import run_bench

    cfg = bench_from_args(args)
    run_bench(cfg)
    print((Path(cfg.out) / "table.md").read_text())
    return 0


def add_demo(sub) -> None:
    d = sub.add_parser("demo", help="the demo models: run (default), build, samples, card")
    d.add_argument("action", nargs="?", default="run", choices=("run", "build", "samples", "card"),
                   help="run: caption the bundled clips without and with sparrow (default); build: retrain the "
                        "demo models from scratch; samples: rewrite the bundled clips; card: write the model card")
    d.add_argument("--bench", default=None, help="card: benchmark folder whose results go into the card")
    d.add_argument("--world", default="hard", choices=("hard", "easy"),
                   help="hard (default): captions with real choice, as hard for a draft as real captioning "
                        "(models/world-hard); easy: the one-template world of models/world, the test suite's smoke "
                        "world")
    d.add_argument("--models", default=None, help="demo model folder (target, sparrow, eagle; default: the "
                                                  "world's, models/world-hard or models/world)")
    d.add_argument("--workdir", default=None, help="build: intermediate files, resumable (default: "
                                                   "runs/world-hard-build or runs/world-build)")
    d.add_argument("--target-minutes", type=float, default=None,
                   help="build: the target's main training stage, minutes (default: TargetTrainConfig's)")
    d.add_argument("--extension-minutes", type=float, default=None,
                   help="build: the target's long-clip extension stage, minutes (default: TargetTrainConfig's)")
    d.add_argument("--long-steps", type=int, default=None,
                   help="build: the target's long stage on clips of up to 1,536 s, steps (0: none; default: the "
                        "world's, 0 for the easy world)")
    d.add_argument("--target-from", default=None, metavar="DIR",
                   help="build: start the target's long stage from DIR's weights (e.g. the shipped "
                        "models/world-hard/target) when the workdir has no finished checkpoint of its main stage "
                        "and extension, instead of training those first; build.json records the start")
    d.add_argument("--stages", default=None, choices=("all", "target"),
                   help="build: all (default) or target: stop after the target (no clips, capture or drafts; "
                        "build.json keeps the previous drafts' results, marked as made with the previous target)")
    d.add_argument("--threads", type=int, default=None,
                   help="build: torch threads for training the target (default: TargetTrainConfig's); a resumed long "
                        "stage ends with an uninterrupted run's weights when the count is the same")
    d.add_argument("--drafts-only", action="store_true",
                   help="build: keep the target in --models as it is and redo only the clips, the capture and the "
                        "drafts (a fresh checkout has the shipped target but not its training state)")
    d.add_argument("--max-tokens", type=int, default=None,
                   help="run: longest caption, in tokens (default: 320)")
    d.add_argument("--log", default="runs/demo/vllm.log",
                   help="run: where vLLM's own output goes ('-': to the terminal with the report)")
    d.set_defaults(fn=_demo)


def add_bench(sub) -> None:
    from vllm_sparrow.knobs import add_options

    from .bench.config import BenchConfig

    b = sub.add_parser("bench", help="acceptance and speedup against visual length, per method")
    add_options(b, BenchConfig)
    b.add_argument("--ablation", action="append", default=[], metavar="NAME=DRAFT_DIR[@K][,FIELD=VALUE...]",
                   help="an extra Sparrow draft to run as method NAME, at depth K if given, with fields of its "
                        "config.json set (e.g. ,tree_topk=3) (repeatable)")
    b.add_argument("--with-ablations", action="store_true",
                   help="add every draft in <sparrow>/../ablations (no-mtp, no-ivsb, no-window)")
    b.add_argument("--quick", action="store_true", help="smoke size: 2 short lengths, 1 clip each, batches 1 and 2 "
                                                         "(sizes given on the command line are kept)")
    from .bench.config import QUICK

    b.set_defaults(**dict.fromkeys(QUICK))  # None: not given (bench_config then uses the config's default)
    b.set_defaults(fn=_bench)
