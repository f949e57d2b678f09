"""`sparrow caption --ray`: the items on engine replicas, the rows written here.

The one-process job (batch_caption.py) knows nothing of Ray; this form sits above it and reuses it:
the items to do are the job's own (batch_caption.caption_todo: resume, --retry-errors, --limit).
Each replica (CaptionReplica, a Ray Data actor) opens the job's engine once, as the one-process
command does (batch_caption.open_caption_engine: the target with the Sparrow draft), and turns each
batch of `--chunk` items into their rows with the same code (batch_caption.run_chunk: undecodable
or refused items become error rows). The driver appends each row durably as it arrives, skipping an
id it has written this run already (a batch run again after its replica died), so the output holds
what the one-process command writes, row for row, in the order the rows finished.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict
from pathlib import Path

from ..batch_caption import (CaptionInterrupted, CaptionJob, CaptionReport, caption_params, caption_todo,
                             open_caption_engine, run_chunk, templater)
from ..durable import append_jsonl
from ..engine_stats import spec_counters
from ..lifetime import record_command
from .cluster import check_fits, open_cluster
from .options import RayOptions
from .replicas import hold_if_asked, replica_resources, run_replicas


class CaptionReplica:
    """One engine replica: the job's engine, captioning the batches Ray Data hands it."""

    def __init__(self, job: dict) -> None:
        record_command()  # the engine processes it starts die with this replica, kill -9 included
        self.job = CaptionJob(**job)
        self.llm = open_caption_engine(self.job)
        self.params = caption_params(self.job)
        self.templater = templater(self.job.target)
        self.name = f"{socket.gethostname()}:{os.getpid()}"

    def __call__(self, batch: dict) -> dict[str, list]:
        items = [json.loads(text) for text in batch["item"].tolist()]
        # in the job's log: which replica holds which items (and the pid to look for)
        print(f"sparrow replica {self.name}: captioning {[it['id'] for it in items]}", flush=True)
        hold_if_asked([it["id"] for it in items])
        before, start = spec_counters(self.llm), time.perf_counter()
        rows = run_chunk(self.llm, items, self.job, self.params, self.templater)
        after = spec_counters(self.llm)
        first = [1] + [0] * (len(rows) - 1)  # the batch's own numbers ride on its first row
        return {"id": [r["id"] for r in rows], "row": [json.dumps(r) for r in rows],
                "replica": [self.name] * len(rows),
                "drafts": [f * (after["num_drafts"] - before["num_drafts"]) for f in first],
                "accepted": [f * (after["num_accepted_tokens"] - before["num_accepted_tokens"]) for f in first],
                "seconds": [f * (time.perf_counter() - start) for f in first]}


class _Tally:
    """What the driver has written this run, for the report (and to write each id once)."""

    def __init__(self) -> None:
        self.ids: set[str] = set()
        self.done = self.errors = self.tokens = self.drafts = self.accepted = 0
        self.served: dict[str, int] = {}
        self.start: float | None = None

    def add(self, result: dict, row: dict) -> None:
        if self.start is None:  # from the moment the first batch began (replica start-up apart)
            self.start = time.perf_counter() - float(result["seconds"])
        self.ids.add(row["id"])
        self.done += "caption" in row
        self.errors += "error" in row
        self.tokens += row.get("output_tokens", 0)
        self.drafts += int(result["drafts"])
        self.accepted += int(result["accepted"])
        self.served[result["replica"]] = self.served.get(result["replica"], 0) + 1

    def report(self, skipped: int) -> CaptionReport:
        seconds = time.perf_counter() - self.start if self.start is not None else 0.0
        acc = 1 + self.accepted / self.drafts if self.drafts else None
        return CaptionReport(self.done, self.errors, skipped, seconds, self.tokens, acc, dict(self.served))


def caption_on_ray(job: CaptionJob, opts: RayOptions, progress: bool = True, progress_file=None) -> CaptionReport:
    """Caption job's items not in its output yet on opts.replicas replicas of the cluster at
    opts.ray, appending rows to job.out; a run with nothing to do starts no cluster. Ctrl-C stops
    the cluster's work (a local cluster is shut down) and raises CaptionInterrupted."""
    from tqdm import tqdm

    opts.check_cluster_job()
    todo = caption_todo(job)  # bad input fails before any cluster starts
    if not todo.items:
        return CaptionReport.nothing_done(todo.skipped)
    out, tally, bar = Path(job.out), _Tally(), None
    try:
        with open_cluster(opts.ray) as ray:
            resources = replica_resources(ray, opts, job.engine_args)
            check_fits(ray, opts.ray, opts.replicas, resources)
            results = run_replicas(ray, [{"item": json.dumps(it)} for it in todo.items], CaptionReplica,
                                   {"job": asdict(job)}, opts, resources, job.chunk, ordered=False)
            for result in results:
                if bar is None:  # drawn from the first row, so its rate and ETA leave start-up out
                    bar = tqdm(total=len(todo.items), desc="caption", unit="video", disable=not progress,
                               file=progress_file)
                if result["id"] in tally.ids:  # a batch run again after its replica died
                    continue
                row = json.loads(result["row"])
                append_jsonl(out, row)
                tally.add(result, row)
                bar.update(1)
    except KeyboardInterrupt:
        raise CaptionInterrupted(len(tally.ids)) from None
    finally:
        if bar is not None:
            bar.close()
    return tally.report(todo.skipped)
