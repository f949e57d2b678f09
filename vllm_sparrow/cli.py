"""The `sparrow` command: init-draft, capture, probe-layers, train, export, caption, demo, bench."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path


def _init_draft(args) -> int:
    from .checkpoint import init_draft

    window = None if args.window in ("none", "null", "all") else int(args.window)
    out = init_draft(args.target, args.out, anchor_tokens=args.anchors, window_tokens=window,
                     speculative_tokens=args.k, seed=args.seed)
    print(f"wrote a randomly initialised Sparrow draft for {args.target} to {out}")
    return 0


def _capture(args) -> int:
    from .training.capture import CaptureConfig, capture

    report = capture(CaptureConfig(
        target=args.target, data=args.data, out=args.out, ivsb_layer=args.ivsb_layer,
        num_frames=args.frames, regenerate=args.regenerate, max_new_tokens=args.max_new_tokens,
        max_seq_len=args.max_seq_len, shard_size=args.shard_size, store_dtype=args.store_dtype,
        device=args.device, limit=args.limit, eagle_baseline=args.eagle_baseline, eagle3=args.eagle3))
    print(f"{args.out}: {report.summary()}"
          + (f" (resumed after {report.resumed_from} done)" if report.resumed_from else ""))
    return 0


def _probe_layers(args) -> int:
    from .training.data import BadSample, load_media, read_samples
    from .training.probe_layers import format_probe, probe_layers
    from .training.target_runner import HFTarget

    target = HFTarget(args.target, device=args.device, attn_implementation="eager")
    rows = [r for r in read_samples(args.data) if not isinstance(r, BadSample) and r.media_kind][: args.samples]
    inputs = (target.encode(r.prompt, r.media_kind, load_media(r, args.frames)) for r in rows)
    print(format_probe(probe_layers(target.model, inputs, target.spec.visual_token_ids)))
    return 0


def _train(args) -> int:
    from .training.train import TrainConfig, train

    window = None if args.window in ("none", "null", "all") else int(args.window)
    result = train(TrainConfig(
        capture=args.capture, out=args.out, init=args.init, draft_kind=args.draft_kind, steps=args.steps,
        batch_samples=args.batch_samples, lr=args.lr, warmup_steps=args.warmup_steps,
        hidden_loss_weight=args.hidden_loss_weight, mtp_steps=args.mtp_steps,
        mtp_weight=args.mtp_weight, ivsb=not args.no_ivsb, visual_fraction=args.visual_fraction,
        visual_drop=args.visual_drop,
        loss_on_prompt=args.loss_on_prompt, anchor_tokens=args.anchors, window_tokens=window,
        speculative_tokens=args.k, holdout=args.holdout, val_every=args.val_every,
        save_every=args.save_every, seed=args.seed, device=args.device))
    if int(os.environ.get("RANK", "0")) != 0:
        return 0  # torchrun: rank 0 reports and exports
    acc = result.acceptance
    print(f"trained {result.steps} steps: loss {result.last_loss:.4f}, top-1 {result.top1:.3f}")
    if acc is not None:
        print(f"simulated mean acceptance length on {args.holdout} held-out samples (K={args.k}, "
              f"bonus included): {acc.mean_acceptance_length:.3f} over {acc.drafts} drafts")
    print(f"draft exported to {result.draft_dir}")
    return 0


def _export(args) -> int:
    from .training.export import export_run

    print(f"exported {export_run(args.run, args.out, draft_vocab=args.draft_vocab)}")
    return 0


def _calibrate_stop(args) -> int:
    from .checkpoint import load_draft, save_draft
    from .training.acceptance import calibrate_stop_confidence
    from .training.shards import ShardReader
    from .training.target_runner import HFTarget

    reader = ShardReader(args.capture)
    samples = [reader[i] for i in range(max(0, len(reader) - args.samples), len(reader))]  # the held-out tail
    draft = load_draft(args.draft)
    target = HFTarget(reader.manifest.settings["target"])
    best, scores = calibrate_stop_confidence(draft, target, samples, args.k, args.verify_token_cost)
    for key, value in scores.items():
        print(f"  stop_confidence {key}: {value:.3f} tokens per unit of verify cost")
    print(f"best: {'off (always K tokens)' if best is None else best}")
    if args.write:
        draft.cfg.stop_confidence = best
        save_draft(draft, args.draft)
        print(f"wrote stop_confidence={best} into {args.draft}/config.json")
    return 0


def _caption(args) -> int:
    import json

    from .batch_caption import CaptionJob, DuplicateIds, caption_batch

    try:
        report = caption_batch(CaptionJob(
            inputs=args.inputs, out=args.out, target=args.target, draft=args.draft, num_speculative_tokens=args.k,
            prompt=args.prompt, num_frames=args.frames, max_tokens=args.max_tokens, chunk=args.chunk,
            engine_args=json.loads(args.engine_args)))
    except DuplicateIds as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(report.summary())
    return 0


def _demo(args) -> int:
    """run: caption the bundled clips with the shipped demo models, without and with sparrow;
    build: retrain those models from scratch; samples: rewrite the bundled clips."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from .demo import run_demo

    if args.action == "samples":
        run_demo.write_samples()
        print(f"wrote {run_demo.SAMPLES}")
        return 0
    if args.action == "card":
        from .demo.model_card import write_card

        print(f"wrote {write_card(Path(args.models), Path(args.workdir), Path(args.bench) if args.bench else None)}")
        return 0
    if args.action == "build":
        from .demo.build import DemoBuildConfig, build
        from .demo.train_target import TargetTrainConfig

        target = TargetTrainConfig()
        if args.target_minutes is not None:
            target.minutes = args.target_minutes
        if args.extension_minutes is not None:
            target.extension = replace(target.extension, minutes=args.extension_minutes)
        cfg = DemoBuildConfig(out=args.models, work=args.workdir, target=target)
        for name, path in build(cfg).items():
            print(f"{name}: {path}")
        return 0
    return run_demo.run_demo(Path(args.models), max_tokens=args.max_tokens)


def _bench(args) -> int:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from .bench.config import METHODS, BenchConfig, quick
    from .bench.run import run_bench

    ablations = dict(a.split("=", 1) for a in args.ablation)
    if args.with_ablations:  # every draft under <sparrow>/../ablations (what `sparrow demo build` writes)
        folder = Path(args.sparrow).parent / "ablations"
        ablations.update({d.name: str(d) for d in sorted(folder.iterdir()) if (d / "config.json").exists()})
    cfg = BenchConfig(target=args.target, sparrow=args.sparrow, eagle=args.eagle, eagle3=args.eagle3, out=args.out,
                      methods=tuple(args.methods.split(",")) if args.methods else METHODS,
                      ablations=ablations, clips_per_length=args.clips,
                      batch_sizes=tuple(int(x) for x in args.batch_sizes.split(",")),
                      num_speculative_tokens=args.k, max_tokens=args.max_tokens)
    if args.lengths:
        cfg.lengths = tuple(int(x) for x in args.lengths.split(","))
    if args.quick:
        cfg = quick(cfg)
    run_bench(cfg)
    print((Path(cfg.out) / "table.md").read_text())
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="sparrow", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    i = sub.add_parser("init-draft", help="write a randomly initialised Sparrow draft for a target")
    i.add_argument("--target", required=True, help="target model directory (Hugging Face format)")
    i.add_argument("--out", required=True, help="draft directory to write")
    i.add_argument("--anchors", type=int, default=4, help="anchor text tokens A")
    i.add_argument("--window", default="512", help="window text tokens W, or 'none' for all")
    i.add_argument("--k", type=int, default=3, help="default number of speculative tokens")
    i.add_argument("--seed", type=int, default=0)
    i.set_defaults(fn=_init_draft)
    c = sub.add_parser("capture", help="run the target over a JSONL dataset; store training states")
    c.add_argument("--target", required=True)
    c.add_argument("--data", required=True, help="JSONL of samples (see vllm_sparrow/training/data.py)")
    c.add_argument("--out", required=True, help="capture directory (rerun to resume)")
    c.add_argument("--ivsb-layer", type=int, default=None, help="target layer of the visual states")
    c.add_argument("--frames", type=int, default=16, help="frames sampled per video")
    c.add_argument("--regenerate", action="store_true", help="let the target rewrite given responses")
    c.add_argument("--max-new-tokens", type=int, default=256)
    c.add_argument("--max-seq-len", type=int, default=16384)
    c.add_argument("--shard-size", type=int, default=64)
    c.add_argument("--store-dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    c.add_argument("--device", default="cpu")
    c.add_argument("--limit", type=int, default=None, help="first N lines only")
    c.add_argument("--eagle-baseline", action="store_true",
                   help="also store the states the EAGLE-style baseline trains on")
    c.add_argument("--eagle3", action="store_true",
                   help="also store the EAGLE-3 auxiliary states (the target layers vLLM hands an eagle3 draft)")
    c.set_defaults(fn=_capture)
    pl = sub.add_parser("probe-layers", help="measure text->visual attention per layer; suggest the IVSB layer")
    pl.add_argument("--target", required=True)
    pl.add_argument("--data", required=True)
    pl.add_argument("--samples", type=int, default=8)
    pl.add_argument("--frames", type=int, default=16)
    pl.add_argument("--device", default="cpu")
    pl.set_defaults(fn=_probe_layers)
    t = sub.add_parser("train", help="train a Sparrow draft (stage 1 + IVSB + MTP); rerun to resume")
    t.add_argument("--capture", required=True)
    t.add_argument("--out", required=True, help="run directory; the draft lands in OUT/draft")
    t.add_argument("--init", default=None, help="draft to start from (default: random init)")
    t.add_argument("--draft-kind", default="sparrow", choices=["sparrow", "eagle", "eagle3"],
                   help="eagle / eagle3: the baselines, exported for vLLM's methods 'eagle' / 'eagle3' "
                        "(eagle3 needs a capture made with --eagle3)")
    t.add_argument("--steps", type=int, default=1000)
    t.add_argument("--batch-samples", type=int, default=1)
    t.add_argument("--lr", type=float, default=3e-4)
    t.add_argument("--warmup-steps", type=int, default=0)
    t.add_argument("--hidden-loss-weight", type=float, default=0.1)
    t.add_argument("--mtp-steps", type=int, default=2, help="MTP stages after stage 1 (0 = off)")
    t.add_argument("--mtp-weight", type=float, default=0.5, help="stage s loss weight = w**s")
    t.add_argument("--no-ivsb", action="store_true", help="ablation: no visual states in training")
    t.add_argument("--visual-fraction", type=float, default=1.0, help="share of visual states shown")
    t.add_argument("--visual-drop", type=float, default=0.0,
                   help="share of samples trained with no visual states (IVSB dropout)")
    t.add_argument("--loss-on-prompt", action="store_true")
    t.add_argument("--anchors", type=int, default=4)
    t.add_argument("--window", default="512")
    t.add_argument("--k", type=int, default=3, help="draft length of the validation replay")
    t.add_argument("--holdout", type=int, default=2, help="last N captured samples for validation")
    t.add_argument("--val-every", type=int, default=0)
    t.add_argument("--save-every", type=int, default=100)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--device", default="cpu")
    t.set_defaults(fn=_train)
    e = sub.add_parser("export", help="write the plugin draft directory from a run's last checkpoint")
    e.add_argument("--run", required=True)
    e.add_argument("--out", required=True)
    e.add_argument("--draft-vocab", type=int, default=None, metavar="N",
                   help="also write a reduced draft vocabulary: the N most frequent text tokens of the "
                        "run's training capture (the draft proposes only those; lossless either way)")
    e.set_defaults(fn=_export)
    cal = sub.add_parser("calibrate-stop", help="pick the adaptive-length threshold of a Sparrow draft on held-out "
                                                  "captured samples")
    cal.add_argument("--draft", required=True)
    cal.add_argument("--capture", required=True, help="capture of the draft's target; its last --samples are used")
    cal.add_argument("--samples", type=int, default=8)
    cal.add_argument("--k", type=int, default=8, help="speculative tokens the server will draft")
    cal.add_argument("--verify-token-cost", type=float, default=0.1,
                     help="cost of one more verified token relative to a verify step's fixed cost")
    cal.add_argument("--write", action="store_true", help="store the best threshold in the draft's config.json")
    cal.set_defaults(fn=_calibrate_stop)
    cap = sub.add_parser("caption", help="caption a folder or JSONL of videos (resumable, one JSONL row each)")
    cap.add_argument("--target", required=True)
    cap.add_argument("--draft", default=None, help="Sparrow draft directory (omit: no speculation)")
    cap.add_argument("--k", type=int, default=3, help="speculative tokens per step")
    cap.add_argument("--inputs", required=True, help="folder of videos or JSONL of {video, prompt?, id?}")
    cap.add_argument("--out", required=True, help="output JSONL; rerun the same command to resume")
    cap.add_argument("--prompt", default="Describe this video in detail.")
    cap.add_argument("--frames", type=int, default=16)
    cap.add_argument("--max-tokens", type=int, default=256)
    cap.add_argument("--chunk", type=int, default=8, help="requests handed to vLLM at once")
    cap.add_argument("--engine-args", default="{}",
                     help='extra LLM(...) arguments as JSON, e.g. {"max_model_len": 32768}')
    cap.set_defaults(fn=_caption)
    d = sub.add_parser("demo", help="the demo models: run (default), build, samples, card")
    d.add_argument("action", nargs="?", default="run", choices=("run", "build", "samples", "card"))
    d.add_argument("--bench", default=None, help="card: benchmark folder whose results go into the card")
    d.add_argument("--models", default="models/world", help="demo model folder (target, sparrow, eagle)")
    d.add_argument("--workdir", default="runs/world-build", help="build: intermediate files (resumable)")
    d.add_argument("--target-minutes", type=float, default=None,
                   help="build: the target's main training stage, minutes (default: TargetTrainConfig's)")
    d.add_argument("--extension-minutes", type=float, default=None,
                   help="build: the target's long-clip extension stage, minutes (default: TargetTrainConfig's)")
    d.add_argument("--max-tokens", type=int, default=320)
    d.set_defaults(fn=_demo)
    b = sub.add_parser("bench", help="acceptance and speedup against visual length, per method")
    b.add_argument("--target", default="models/world/target")
    b.add_argument("--sparrow", default="models/world/sparrow")
    b.add_argument("--eagle", default="models/world/eagle")
    b.add_argument("--eagle3", default="models/world/eagle3", help="an EAGLE-3 draft (vLLM's eagle3 format)")
    b.add_argument("--out", default="runs/bench")
    b.add_argument("--lengths", default=None, help="visual tokens, comma separated (default: 512,...,24960)")
    b.add_argument("--methods", default=None, help="comma separated subset of none,sparrow,eagle,eagle3,ngram")
    b.add_argument("--ablation", action="append", default=[], metavar="NAME=DRAFT_DIR",
                   help="an extra Sparrow draft to run as method NAME (repeatable)")
    b.add_argument("--with-ablations", action="store_true",
                   help="add every draft in <sparrow>/../ablations (no-mtp, no-ivsb, no-window)")
    b.add_argument("--clips", type=int, default=2, help="clips per length (batch size 1)")
    b.add_argument("--batch-sizes", default="1",
                   help="comma separated; B > 1 submits B clips of a length together (default: 1)")
    b.add_argument("--k", type=int, default=3, help="speculative tokens")
    b.add_argument("--max-tokens", type=int, default=320)
    b.add_argument("--quick", action="store_true", help="smoke size: 2 short lengths, 1 clip each")
    b.set_defaults(fn=_bench)
    args = p.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
