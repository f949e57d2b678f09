"""`sparrow capture --engine --ray`: the samples on engine replicas, the manifest kept here.

The one-process capture (training/capture.py) knows nothing of Ray; this form sits above it and
runs it whole (capture.capture: settings, resume, data-file and disk checks, the report) with a
runner of its own in place of the one engine.

Each replica (CaptureReplica, a Ray Data actor) opens the capture engine once, as the one-process
`--engine` capture does (engine_target.engine_args: eager, no prefix cache, the worker extension),
turns each batch of `--batch` samples into their tensors with the same code
(engine_target.engine_chunk) and writes them whole as one shard file into the capture directory
(shards.write_shard: the directory must be on storage every node shares). The driver, the
capture's one writer of its manifest, lists each shard as its batch comes back, in the samples'
order (the Dataset keeps it here), and records the skipped samples, so the manifest lists the
samples the one-process capture's lists, in the same order, in shards of one batch each; the
settings, resume and refusal rules are capture.py's. A batch run again after its replica died
comes back with the same file, written again whole; the driver lists it once. A shard that a
killed driver never listed is deleted by the next run, which captures its samples again.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict
from pathlib import Path

from ..batch_caption import EngineInterrupted
from ..lifetime import record_command
from ..training.capture import CaptureConfig, CaptureReport, capture
from ..training.data import BadSample, Sample
from ..training.shards import ShardWriter, write_shard
from .cluster import check_fits, open_cluster
from .options import BadRayOptions, RayOptions
from .replicas import hold_if_asked, replica_resources, run_replicas

SHARD = "shard-r{:09d}.safetensors"  # named by its batch's first sample: never a one-process shard's name


class CaptureReplica:
    """One engine replica: the capture engine, writing a shard for each batch Ray Data hands it."""

    def __init__(self, cfg: dict) -> None:
        from ..batch_caption import open_engine
        from ..training.engine_target import EngineTarget, engine_args
        from ..training.target_runner import TargetInputs

        record_command()  # the engine processes it starts die with this replica, kill -9 included
        self.cfg = CaptureConfig(**cfg)
        inputs = TargetInputs(self.cfg.target)
        args = engine_args(self.cfg.max_seq_len, inputs.max_positions, self.cfg.engine_args)
        self.target = EngineTarget(self.cfg.target, open_engine(self.cfg.target, args), inputs)
        self.name = f"{socket.gethostname()}:{os.getpid()}"

    def __call__(self, batch: dict) -> dict[str, list]:
        from ..training.engine_target import engine_chunk

        samples = [sample_from_json(text) for text in batch["sample"].tolist()]
        print(f"sparrow replica {self.name}: capturing samples {[s.index for s in samples]}", flush=True)
        hold_if_asked([s.index for s in samples])
        start = time.perf_counter()
        self.target.scratch.mkdir(exist_ok=True)
        try:
            results = engine_chunk(self.target, samples, self.cfg)
        finally:  # a replica ends killed (its cluster shut down), never closed: no scratch folder between batches
            self.target.close()
        kept = {s.index: r for s, r in zip(samples, results) if not isinstance(r, BadSample)}
        entry = write_shard(Path(self.cfg.out), SHARD.format(samples[0].index), kept) if kept else None
        done = {"entry": entry, "samples": [s.index for s in samples], "replica": self.name,
                "skipped": {str(r.index): f"{r.reason}: {r.detail}" for r in results if isinstance(r, BadSample)},
                "seconds": time.perf_counter() - start}
        return {"done": [json.dumps(done)]}  # one row per batch: the shard and the skips it brings


def sample_to_json(s: Sample) -> str:
    return json.dumps({**asdict(s), "media_path": None if s.media_path is None else str(s.media_path)})


def sample_from_json(text: str) -> Sample:
    d = json.loads(text)
    return Sample(**{**d, "media_path": None if d["media_path"] is None else Path(d["media_path"]),
                     "response_ids": None if d["response_ids"] is None else tuple(d["response_ids"])})


def check_capture_on_ray(cfg: CaptureConfig, opts: RayOptions) -> None:
    """Refuse, before anything is written, a capture the replicas cannot run."""
    opts.check_cluster_job()
    if not cfg.engine:
        raise BadRayOptions("--ray runs the engine capture: add --engine (its replicas are vLLM engines)")
    if cfg.shard is not None:
        raise BadRayOptions("--ray spreads the capture over its --replicas: drop --shard")


def capture_on_ray(cfg: CaptureConfig, opts: RayOptions, progress: bool = True) -> CaptureReport:
    """The engine capture of cfg on opts.replicas replicas of the cluster at opts.ray: capture.py's
    capture, its samples run by the replicas and their shards listed here. Ctrl-C stops the
    cluster's work (a local cluster is shut down; listed shards stay) and raises EngineInterrupted."""
    check_capture_on_ray(cfg, opts)

    def on_replicas(cfg: CaptureConfig, inputs, todo: list, writer: ShardWriter, progress: bool) -> float:
        return _run_on_replicas(cfg, opts, todo, writer, progress)  # inputs: each replica loads its own

    return capture(cfg, progress, runner=on_replicas)


def _run_on_replicas(cfg: CaptureConfig, opts: RayOptions, todo: list, writer: ShardWriter, progress: bool) -> float:
    """Capture `todo` (Sample or BadSample) on the replicas, listing their shards through `writer`;
    returns the seconds from the first batch's start (the replicas' start-up excluded)."""
    from tqdm import tqdm

    drop_unlisted_shards(writer)
    for bad in (r for r in todo if isinstance(r, BadSample)):  # known here already: no replica needed
        writer.skip(bad.index, f"{bad.reason}: {bad.detail}")
    samples = [r for r in todo if not isinstance(r, BadSample)]
    if not samples:
        return 0.0
    seen: set[int] = set()
    bar, start, served = None, None, {}
    try:
        with open_cluster(opts.ray) as ray:
            resources = replica_resources(ray, opts, cfg.engine_args)
            check_fits(ray, opts.ray, opts.replicas, resources)
            rows = [{"sample": sample_to_json(s)} for s in samples]
            for result in run_replicas(ray, rows, CaptureReplica, {"cfg": asdict(cfg)}, opts, resources, cfg.batch,
                                       ordered=True):
                done = json.loads(result["done"])
                if bar is None:  # drawn from the first batch, so its rate and ETA leave start-up out
                    start = time.perf_counter() - done["seconds"]
                    bar = tqdm(total=len(samples), desc="capture", unit="sample", disable=not progress)
                if seen.issuperset(done["samples"]):  # a batch run again after its replica died
                    continue
                seen.update(done["samples"])
                _list(writer, done)
                served[done["replica"]] = served.get(done["replica"], 0) + len(done["samples"])
                bar.update(len(done["samples"]))
                bar.set_postfix(kept=len(writer.manifest.samples()), skipped=len(writer.manifest.skipped))
    except KeyboardInterrupt:  # the cluster's work is stopped (a local one shut down); listed shards stay
        raise EngineInterrupted() from None
    finally:
        if bar is not None:
            bar.close()
    print(f"capture: served by {len(served)} replicas ({', '.join(f'{k} {n}' for k, n in sorted(served.items()))})",
          flush=True)
    return time.perf_counter() - start if start is not None else 0.0


def _list(writer: ShardWriter, done: dict) -> None:
    """Record a batch: its shard (written whole by its replica) in the manifest, then its skips."""
    if done["entry"] is not None:
        writer.add_written(done["entry"])
    for index, message in done["skipped"].items():
        writer.skip(int(index), message)


def drop_unlisted_shards(writer: ShardWriter) -> None:
    """Delete replica shards the manifest does not list: written for a driver killed before it
    listed them (their samples are not done, so this run captures them again)."""
    listed = {s["file"] for s in writer.manifest.shards}
    for path in writer.out_dir.glob(SHARD.replace("{:09d}", "*")):
        if path.name not in listed:
            path.unlink(missing_ok=True)
