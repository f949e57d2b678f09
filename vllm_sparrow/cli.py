"""The `sparrow` command: init-draft, respond, capture, probe-layers, train, export, calibrate-stop, tune, caption;
plus the commands other installed packages add (the demo kit's `demo` and `bench`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .knobs import add_options, from_args


def _init_draft(args) -> int:
    from .checkpoint import init_draft

    out = init_draft(args.target, args.out, anchor_tokens=args.anchor_tokens, window_tokens=args.window_tokens,
                     speculative_tokens=args.speculative_tokens, seed=args.seed)
    print(f"wrote a randomly initialised Sparrow draft for {args.target} to {out}")
    return 0


def _cluster(args):
    """The command's RayOptions when --ray is given, else None; cluster knobs without --ray are
    refused (BadRayOptions) either way."""
    from .ray_jobs.options import RayOptions

    opts = from_args(RayOptions, args)
    opts.check_ray_options()
    return opts if opts.ray is not None else None


def _capture(args) -> int:
    from .batch_caption import EngineInterrupted
    from .ray_jobs.options import ClusterRefused
    from .ray_jobs.replicas import ReplicaFailed
    from .training.capture import CaptureConfig, capture
    from .training.shards import CaptureMismatch

    cfg = from_args(CaptureConfig, args)
    try:
        if (cluster := _cluster(args)) is None:
            report = capture(cfg)
        else:  # the same capture, its samples on the cluster's engine replicas
            from .ray_jobs.capture import capture_on_ray

            report = capture_on_ray(cfg, cluster)
    except (CaptureMismatch, ClusterRefused) as e:  # another capture's folder, another split, too big for the
        # disk; or --ray options that cannot run, or no Ray installed
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ReplicaFailed as e:  # --ray: a replica raised; the listed shards stay
        print(f"error: a replica failed: {e}", file=sys.stderr)
        return 1
    except EngineInterrupted:  # --engine: the engine was shut down; finished shards stay
        print("interrupted: rerun the same command to resume", file=sys.stderr)
        return 130
    print(f"{args.out}: {report.summary()}"
          + (f" (resumed after {report.resumed_from} done)" if report.resumed_from else "")
          + (f"; {report.seconds:.1f} s capturing" if report.seconds else ""))
    print(f"next: sparrow train --capture {args.out} --out RUN   (RUN/draft is the plugin draft)")
    return 0


def _respond(args) -> int:
    from .batch_caption import EngineInterrupted
    from .logs import logs_to
    from .training.respond import RespondConfig, RespondRefused, respond, work_file

    cfg = from_args(RespondConfig, args)
    log = None if cfg.log == "-" else Path(cfg.log or f"{cfg.out}.vllm.log")
    with logs_to(log) as term:  # the terminal gets progress and the report; vLLM's output goes to the log
        try:
            report = respond(cfg, progress_file=term)
        except RespondRefused as e:
            print(f"error: {e}", file=term)
            return 2
        except EngineInterrupted:
            print(f"interrupted: the responses so far are in {work_file(cfg.out)}; rerun the same command to "
                  "resume", file=term)
            return 130
        print(f"{cfg.out}: {report.summary()}" + (f" (vLLM's log: {log})" if log and report.responded else ""),
              file=term)
    print(f"next: sparrow capture --target {cfg.target} --data {cfg.out} --out CAPTURE --frames {cfg.num_frames}")
    return 0


def _probe_layers(args) -> int:
    from .training.data import BadSample, load_media, read_samples
    from .training.probe_layers import format_probe, probe_layers
    from .training.target_runner import HFTarget

    target = HFTarget(args.target, device=args.device, attn_implementation="eager")
    rows = [r for r in read_samples(args.data) if not isinstance(r, BadSample) and r.media_kind][: args.samples]
    inputs = (target.encode(r.prompt, r.media_kind, load_media(r, args.frames)) for r in rows)
    probe = probe_layers(target.model, inputs, target.spec.visual_token_ids)
    print(format_probe(probe))
    print(f"next: sparrow capture --target {args.target} --data {args.data} --out CAPTURE "
          f"--ivsb-layer {probe.suggested_layer}")
    return 0


def _train(args) -> int:
    from .training.train import TrainConfig, TrainingRefused, train

    try:
        result = train(from_args(TrainConfig, args))
    except TrainingRefused as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if int(os.environ.get("RANK", "0")) != 0:
        return 0  # torchrun: rank 0 reports and exports
    acc = result.acceptance
    if result.already_done:
        print(f"{args.out} has trained its {result.steps} steps already (last logged: loss {result.last_loss:.4f}, "
              f"top-1 {result.top1:.3f}); rerun with a larger --steps to train on")
    else:
        print(f"trained {result.steps} steps: loss {result.last_loss:.4f}, top-1 {result.top1:.3f}")
    if acc is not None:
        print(f"simulated mean acceptance length on {args.holdout} held-out samples (K={len(acc.per_position)}, "
              f"bonus included): {acc.mean_acceptance_length:.3f} over {acc.drafts} drafts")
    spec = {"method": args.draft_kind, "model": str(result.draft_dir)}
    if result.depth is not None and args.draft_kind == "sparrow":
        print(f"{result.depth.summary()}; written into {result.draft_dir}/config.json (the plugin drafts it "
              "unless num_speculative_tokens is given)")
    elif args.draft_kind != "sparrow":  # vLLM's eagle / eagle3 need the depth in the speculative config
        spec["num_speculative_tokens"] = args.speculative_tokens or (result.depth.depth if result.depth else 3)
    print(f"draft exported to {result.draft_dir}\nnext: serve it with vllm serve TARGET --speculative-config "
          f"'{json.dumps(spec)}'")
    return 0


def _export(args) -> int:
    from .training.export import export_run

    try:
        draft = export_run(args.run, args.out, draft_vocab=args.draft_vocab)
    except (FileNotFoundError, ValueError) as e:  # no run there, no checkpoint yet, a bad option
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"draft written to {draft}\nnext: serve it with vllm serve TARGET --speculative-config "
          f"'{{\"method\": \"sparrow\", \"model\": \"{draft}\"}}'")
    return 0


def _calibrate_stop(args) -> int:
    from .checkpoint import load_draft, save_draft
    from .training.acceptance import calibrate_stop_confidence
    from .training.shards import ShardReader
    from .training.target_runner import HFTarget

    reader = ShardReader(args.capture)
    samples = [reader[i] for i in range(max(0, len(reader) - args.samples), len(reader))]  # the held-out tail
    draft = load_draft(args.draft)
    k = args.k or draft.cfg.speculative_tokens
    target = HFTarget(reader.manifest.settings["target"])
    best, scores = calibrate_stop_confidence(draft, target, samples, k, args.verify_token_cost)
    for key, value in scores.items():
        print(f"  stop_confidence {key}: {value:.3f} tokens per unit of verify cost (K = {k})")
    print(f"best: {'off (always K tokens)' if best is None else best}")
    if args.write:
        draft.cfg.stop_confidence = best
        save_draft(draft, args.draft)
        print(f"wrote stop_confidence={best} into {args.draft}/config.json; serve the draft as before (a server "
              "started earlier reads it when restarted)")
    elif best is not None:
        print(f"next: rerun with --write to store stop_confidence={best} in {args.draft}/config.json")
    return 0


def _tune(args) -> int:
    from .logs import logs_to
    from .training.tune import TuneConfig, tune

    cfg = from_args(TuneConfig, args)
    log = Path(f"{cfg.out}.vllm.log" if cfg.out else "sparrow-tune.vllm.log")  # not inside the draft's folder
    with logs_to(log) as term:  # vLLM's output goes to the log, the measurements to the terminal
        try:
            result = tune(cfg, progress=lambda line: print(line, file=term, flush=True))
        except ValueError as e:
            print(f"error: {e}", file=term)
            return 2
        print(result.summary(), file=term)
        if cfg.write:
            print(f"wrote the schedule and depth {result.schedule[0][2]} (batch 1) into {cfg.draft}/config.json: the "
                  "plugin serves them unless num_speculative_tokens is given", file=term)
        else:
            print(f"next: rerun with --write to store them in {cfg.draft}/config.json", file=term)
    return 0


def _caption(args) -> int:
    from .batch_caption import CaptionInterrupted, CaptionJob, DuplicateIds, caption_batch
    from .logs import logs_to
    from .ray_jobs.options import ClusterRefused
    from .ray_jobs.replicas import ReplicaFailed

    job = from_args(CaptionJob, args)
    log = None if job.log == "-" else Path(job.log or f"{job.out}.vllm.log")
    with logs_to(log) as term:  # the terminal gets progress and the report; vLLM's (and Ray's) output goes to the log
        try:
            if (cluster := _cluster(args)) is None:
                report = caption_batch(job, progress_file=term)
            else:  # the same job, its items on the cluster's engine replicas
                from .ray_jobs.caption import caption_on_ray

                report = caption_on_ray(job, cluster, progress_file=term)
        except (DuplicateIds, ClusterRefused) as e:
            print(f"error: {e}", file=term)
            return 2
        except ReplicaFailed as e:  # --ray: a replica raised; the rows written stay
            print(f"error: a replica failed: {e}" + (f" (the whole error is in {log})" if log else ""), file=term)
            return 1
        except CaptionInterrupted as e:
            print(f"interrupted: {e.rows} rows written to {job.out} this run; rerun the same command to resume"
                  + (f" (vLLM's log: {log})" if log else ""), file=term)
            return 130
        print(report.summary() + (f" (vLLM's log: {log})" if log and (report.done or report.errors) else ""),
              file=term)
    return 0


def _kit_commands():
    """add(subparsers) functions registered under the `vllm_sparrow.commands` entry point group
    (sparrow_world adds `demo` and `bench`); the product never imports them itself."""
    from importlib.metadata import entry_points

    for ep in entry_points(group="vllm_sparrow.commands"):
        try:
            yield ep.load()
        except Exception as e:  # noqa: BLE001 - a broken add-on must not take the product's commands down
            print(f"sparrow: command {ep.name!r} from {ep.value} is unavailable ({type(e).__name__}: {e})",
                  file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    # The configs are plain dataclasses (no torch, no vLLM): importing them keeps --help fast.
    from .batch_caption import CaptionJob
    from .config import SparrowConfig
    from .ray_jobs.options import RayOptions
    from .training.acceptance import StopCalibration
    from .training.capture import CaptureConfig
    from .training.export import ExportJob
    from .training.probe_layers import ProbeJob
    from .training.respond import RespondConfig
    from .training.train import TrainConfig
    from .training.tune import TuneConfig

    p = argparse.ArgumentParser(prog="sparrow", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    i = sub.add_parser("init-draft", help="write a randomly initialised Sparrow draft for a target")
    i.add_argument("--target", required=True, help="target model directory (Hugging Face format)")
    i.add_argument("--out", required=True, help="draft directory to write")
    add_options(i, SparrowConfig, only=("anchor_tokens", "window_tokens", "speculative_tokens"))
    i.add_argument("--seed", type=int, default=0, help="seed of the random initialisation")
    i.set_defaults(fn=_init_draft)
    r = sub.add_parser("respond", help="the target's own greedy responses to a JSONL dataset, written by vLLM "
                                       "(resumable; capture then stores them as they are)")
    add_options(r, RespondConfig)
    r.set_defaults(fn=_respond)
    c = sub.add_parser("capture", help="run the target over a JSONL dataset; store training states")
    add_options(c, RayOptions)  # --ray: the same capture on engine replicas of a Ray cluster
    add_options(c, CaptureConfig)
    c.set_defaults(fn=_capture)
    pl = sub.add_parser("probe-layers", help="measure text->visual attention per layer; suggest the IVSB layer")
    add_options(pl, ProbeJob)
    pl.set_defaults(fn=_probe_layers)
    t = sub.add_parser("train", help="train a Sparrow draft (stage 1 + IVSB + MTP); rerun to resume")
    add_options(t, TrainConfig)
    t.set_defaults(fn=_train)
    e = sub.add_parser("export", help="write the plugin draft directory from a run's last checkpoint")
    add_options(e, ExportJob)
    e.set_defaults(fn=_export)
    cal = sub.add_parser("calibrate-stop", help="pick the adaptive-length threshold of a Sparrow draft on held-out "
                                                  "captured samples")
    add_options(cal, StopCalibration)
    cal.set_defaults(fn=_calibrate_stop)
    tu = sub.add_parser("tune", help="choose the draft's depth per batch size from its held-out replay and the "
                                     "step costs vLLM measures on this machine")
    add_options(tu, TuneConfig)
    tu.set_defaults(fn=_tune)
    cap = sub.add_parser("caption", help="caption a folder or JSONL of videos (resumable, one JSONL row each)")
    add_options(cap, RayOptions)  # --ray: the same captioning on engine replicas of a Ray cluster
    add_options(cap, CaptionJob)
    cap.set_defaults(fn=_caption)
    for command in _kit_commands():
        command(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    from .durable import DurableWriteError
    from .lifetime import record_command

    args = build_parser().parse_args(argv)
    record_command()  # before any engine starts: every process this command starts dies with it, kill -9 included
    try:
        return args.fn(args)
    except DurableWriteError as e:  # a full disk: say so and how to go on, not a traceback
        print(f"sparrow {args.cmd}: {e.strerror}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # every long command writes kill-safe and resumes: say so, not a traceback
        print(f"sparrow {args.cmd}: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
