"""Capture shards: safetensors files of per-sample tensors plus a manifest that makes runs resumable.

Layout of a capture directory:
  manifest.json              capture settings, finished shards, skipped samples (with reasons)
  shard-00000.safetensors    tensors "<sample>/<name>" for up to `shard_size` samples

A shard and its manifest entry are written only when the shard is full (or at the end), the
manifest atomically after the shard, so an interrupted run loses at most one shard's worth of
samples, which the next run redoes. Memory stays bounded by one shard.

A capture split over N processes (`sparrow capture --shard I/N`, on N GPUs or machines sharing
the directory) is still one capture: the top manifest holds the settings and N, and process I
owns the folder part-I-of-N/ (its own manifest and shards, laid out as above) with the samples
whose line index is I modulo N. No file has two writers, each part resumes on its own, and the
reader joins the parts in sample order, so it reads what one process would have captured.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch
from safetensors import safe_open

from ..durable import atomic_save_safetensors, atomic_write_json

MANIFEST = "manifest.json"
log = logging.getLogger("vllm_sparrow.capture")


class CaptureMismatch(ValueError):
    pass


@dataclass
class Manifest:
    settings: dict[str, Any]
    shards: list[dict[str, Any]] = field(default_factory=list)  # {"file", "samples": [index...]}
    skipped: dict[str, str] = field(default_factory=dict)  # sample index -> message
    data: dict[str, Any] = field(default_factory=dict)  # {"lines", "sha256"} of the data file's lines seen
    parts: int = 0  # N: the capture is split into part-I-of-N/ folders (0: not split)

    def done(self) -> set[int]:
        return {i for s in self.shards for i in s["samples"]} | {int(i) for i in self.skipped}

    def samples(self) -> list[int]:
        return [i for s in self.shards for i in s["samples"]]


def load_manifest(out_dir: Path) -> Manifest | None:
    path = out_dir / MANIFEST
    if not path.is_file():
        return None
    raw = json.loads(path.read_text())
    return Manifest(raw["settings"], raw["shards"], raw["skipped"], raw.get("data", {}), raw.get("parts", 0))


def save_manifest(out_dir: Path, manifest: Manifest) -> None:
    atomic_write_json(out_dir / MANIFEST, vars(manifest))


def open_manifest(out_dir: Path, settings: dict[str, Any]) -> Manifest:
    """The directory's manifest (resume) or a new one; refuses a directory captured differently."""
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = load_manifest(out_dir)
    if manifest is None:
        manifest = Manifest(settings)
        save_manifest(out_dir, manifest)
    elif manifest.settings != settings:
        changed = sorted(k for k in settings.keys() | manifest.settings.keys()
                         if settings.get(k) != manifest.settings.get(k))
        raise CaptureMismatch(
            f"{out_dir} holds a capture made with other settings ({', '.join(changed)}); "
            "capture into a new directory, or rerun with the same settings to resume")
    return manifest


@dataclass(frozen=True)
class Part:
    """Part I of N of a split capture: the samples whose line index is I modulo N."""

    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> Part:
        """'I/N' with 0 <= I < N."""
        try:
            i, n = (int(x) for x in text.split("/"))
        except ValueError:
            raise ValueError(f"--shard {text!r}: give I/N, e.g. 0/4 for the first of 4 processes") from None
        if not (n >= 1 and 0 <= i < n):
            raise ValueError(f"--shard {text!r}: I must be in 0..N-1 (processes are numbered from 0)")
        return cls(i, n)

    def owns(self, index: int) -> bool:
        return index % self.count == self.index

    @property
    def folder(self) -> str:
        return f"part-{self.index}-of-{self.count}"


def open_part(out_dir: Path, settings: dict[str, Any], part: Part | None) -> tuple[Path, Manifest]:
    """The folder a process writes and its manifest. Unsplit: the capture directory itself. Split:
    the top manifest (settings and N: every process writes the same one, atomically, so
    processes starting together do not clash) and the part's own folder and manifest."""
    top = load_manifest(out_dir)
    count = 0 if part is None else part.count
    if top is not None and top.parts != count:
        was = f"split into {top.parts} parts (run with --shard I/{top.parts})" if top.parts else "not split (run without --shard)"
        raise CaptureMismatch(f"{out_dir} holds a capture {was}; capture into a new directory to split it otherwise")
    if part is None:
        return out_dir, open_manifest(out_dir, settings)
    if top is None:
        out_dir.mkdir(parents=True, exist_ok=True)
        save_manifest(out_dir, Manifest(settings, parts=part.count))
    elif top.settings != settings:
        open_manifest(out_dir, settings)  # raises, naming the settings that differ
    folder = out_dir / part.folder
    return folder, open_manifest(folder, settings)


def data_lines_digest(path: str | Path, lines: int | None = None) -> tuple[int, str]:
    """(line count, sha256 of the first `lines` lines (all by default)) of a JSONL data file."""
    import hashlib

    rows = Path(path).read_bytes().splitlines()
    n = len(rows) if lines is None else min(lines, len(rows))
    digest = hashlib.sha256()
    for row in rows[:n]:
        digest.update(row.rstrip() + b"\n")
    return (n if lines is None or lines <= len(rows) else -1), digest.hexdigest()[:16]


def check_data_file(manifest: Manifest, data: str | Path, out_dir: Path) -> None:
    """Samples are indexed by line: refuse a data file whose already-seen lines changed
    (appending lines is fine), then record the file as it is now."""
    if manifest.data:
        n, sha = data_lines_digest(data, manifest.data["lines"])
        if n != manifest.data["lines"] or sha != manifest.data["sha256"]:
            raise CaptureMismatch(
                f"{out_dir} was captured from another version of {data}: its first "
                f"{manifest.data['lines']} lines changed (samples are indexed by line). Capture into "
                "a new directory, or restore the file (appending lines is fine)")
    lines, sha = data_lines_digest(data)
    manifest.data = {"lines": lines, "sha256": sha}
    save_manifest(out_dir, manifest)


class ShardWriter:
    def __init__(self, out_dir: Path, manifest: Manifest, shard_size: int) -> None:
        self.out_dir, self.manifest, self.shard_size = out_dir, manifest, shard_size
        self.buffer: dict[int, dict[str, torch.Tensor]] = {}

    def add(self, index: int, tensors: dict[str, torch.Tensor]) -> None:
        self.buffer[index] = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
        if len(self.buffer) >= self.shard_size:
            self.flush()

    def skip(self, index: int, message: str) -> None:
        self.manifest.skipped[str(index)] = message
        save_manifest(self.out_dir, self.manifest)  # a resumed run does not retry it

    def flush(self) -> None:
        if self.buffer:
            name = f"shard-{len(self.manifest.shards):05d}.safetensors"
            # whole, then listed in the manifest
            self.manifest.shards.append(write_shard(self.out_dir, name, self.buffer))
            self.buffer = {}
        save_manifest(self.out_dir, self.manifest)  # also records skips made since the last shard

    def add_written(self, entry: dict[str, Any]) -> None:
        """List a shard written whole by another process (write_shard: a Ray capture replica)."""
        if self.buffer:  # what this process holds goes first: shards stay in the order they were added
            self.flush()
        self.manifest.shards.append(entry)
        save_manifest(self.out_dir, self.manifest)


def write_shard(out_dir: Path, name: str, samples: dict[int, dict[str, torch.Tensor]]) -> dict[str, Any]:
    """Write samples (index -> tensors) as the shard file `name`, whole (atomically); returns its
    manifest entry, which the capture's one writer lists (ShardWriter.add_written)."""
    flat = {f"{i}/{k}": v.detach().cpu().contiguous() for i, t in samples.items() for k, v in t.items()}
    atomic_save_safetensors(out_dir / name, flat)
    return {"file": name, "samples": sorted(samples)}


class ShardReader:
    """Random access to captured samples by position 0..len-1 (lazy: one sample in memory)."""

    def __init__(self, capture_dir: str | Path) -> None:
        self.dir = Path(capture_dir)
        manifest = load_manifest(self.dir)
        if manifest is None:
            raise FileNotFoundError(f"{self.dir}: no {MANIFEST}; run `sparrow capture` first")
        self.manifest = manifest  # a split capture's top manifest: its settings
        self.where = ([(s["file"], i) for s in manifest.shards for i in s["samples"]] if not manifest.parts
                      else self._join_parts(manifest.parts))  # [(file relative to dir, sample index)]

    def _join_parts(self, count: int) -> list[tuple[str, int]]:
        """Every finished sample of every part, in sample order (what one process captures)."""
        where = []
        for i in range(count):
            folder = Part(i, count).folder
            part = load_manifest(self.dir / folder)
            if part is None:
                log.warning("%s: part %d of %d has not started (sparrow capture --shard %d/%d)", self.dir, i, count,
                            i, count)
                continue
            where += [(f"{folder}/{s['file']}", index) for s in part.shards for index in s["samples"]]
        where.sort(key=lambda fi: fi[1])
        twice = [b for a, b in zip(where, where[1:]) if a[1] == b[1]]
        if twice:  # parts own disjoint lines; a copied folder would break that
            raise CaptureMismatch(f"{self.dir}: samples {[i for _, i in twice][:5]} are in two parts")
        return where

    def __len__(self) -> int:
        return len(self.where)

    def __getitem__(self, pos: int) -> dict[str, torch.Tensor]:
        file, index = self.where[pos]
        with safe_open(str(self.dir / file), framework="pt") as f:
            prefix = f"{index}/"
            return {k[len(prefix):]: f.get_tensor(k) for k in f.keys() if k.startswith(prefix)}

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return (self[i] for i in range(len(self)))
