"""Writes that survive kill -9, power loss and full disks at any moment.

Every artifact a long job produces goes through here:
- whole files (checkpoints, shards, manifests, configs, reports): `atomic_write_*` writes a temp
  file in the same folder, fsyncs it, renames it over the target and fsyncs the folder, so a
  reader finds the old file or the new one, never half of either;
- JSONL rows (caption rows, benchmark records, logs): `append_jsonl` writes one whole line and
  fsyncs; `read_jsonl` treats a last line without its newline as torn (a write cut short),
  truncates it from the file and leaves its item to be redone. A bad line that did end in a
  newline is not a torn write: it is reported with its line number.

Test hook: SPARROW_KILL_AT_WRITE=N kills the process with SIGKILL half way through its N-th
durable write (half the bytes written), so tests can tear a write at a known point;
SPARROW_KILL_AT_WRITE=N:text counts only writes to files whose name contains `text`.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any, Callable

_writes = 0  # durable writes counted by the kill hook in this process


def _dies_here(path: Path) -> bool:
    """True when the SPARROW_KILL_AT_WRITE hook says this write (to `path`) is the fatal one."""
    global _writes
    at = os.environ.get("SPARROW_KILL_AT_WRITE")
    if not at:
        return False
    n, _, text = at.partition(":")
    if text not in path.name:
        return False
    _writes += 1
    return _writes == int(n)


def _write_or_die(path: Path, f, data: bytes) -> None:
    """f.write(data); the hook's fatal write puts half of it on disk first, then dies."""
    if _dies_here(path):
        f.write(data[: len(data) // 2])
        f.flush()
        os.fsync(f.fileno())
        os.kill(os.getpid(), signal.SIGKILL)
    f.write(data)


def _die_with_half_file(path: Path, tmp: Path) -> None:
    """The hook for a file another library wrote to `tmp`: die with half of it there."""
    if _dies_here(path):
        os.truncate(tmp, tmp.stat().st_size // 2)
        os.kill(os.getpid(), signal.SIGKILL)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # not supported here (e.g. some network filesystems)
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_save(path: str | Path, save: Callable[[Path], None]) -> Path:
    """save(tmp_path) writes the file (torch.save, safetensors...); it lands at `path` whole."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        save(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    return path


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    def save(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            _write_or_die(Path(path), f, data)
            f.flush()

    return atomic_save(path, save)


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode())


def atomic_write_json(path: str | Path, obj: Any, indent: int | None = 1) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=indent, default=str) + "\n")


def atomic_torch_save(path: str | Path, obj: Any) -> Path:
    import torch

    def save(tmp: Path) -> None:
        torch.save(obj, tmp)
        _die_with_half_file(Path(path), tmp)

    return atomic_save(path, save)


def atomic_save_safetensors(path: str | Path, tensors: dict, metadata: dict | None = None) -> Path:
    from safetensors.torch import save_file

    def save(tmp: Path) -> None:
        save_file(tensors, str(tmp), metadata=metadata)
        _die_with_half_file(Path(path), tmp)

    return atomic_save(path, save)


def append_jsonl(path: str | Path, row: Any) -> None:
    """Append one row as one line, durably (after repairing a torn tail left by a kill)."""
    path = Path(path)
    repair_tail(path)
    data = (json.dumps(row, default=str) + "\n").encode()
    with open(path, "ab") as f:
        _write_or_die(path, f, data)
        f.flush()
        os.fsync(f.fileno())


def repair_tail(path: Path) -> bool:
    """Cut a torn last line (no trailing newline) off the file; True if one was cut."""
    if not path.is_file() or path.stat().st_size == 0:
        return False
    with open(path, "rb+") as f:
        f.seek(-1, os.SEEK_END)
        if f.read(1) == b"\n":
            return False
        f.seek(0)
        keep = f.read().rfind(b"\n") + 1  # 0 when the only line is torn
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
    return True


def read_jsonl(path: str | Path, repair: bool = True) -> list[dict]:
    """The rows of a JSONL file written by append_jsonl. A torn last line is dropped (and cut
    from the file when `repair`); any other line that is not a JSON object raises ValueError
    naming its line number."""
    path = Path(path)
    if not path.is_file():
        return []
    if repair:
        repair_tail(path)
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    elif lines:  # torn tail, not repaired: skip it
        lines.pop()
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}, line {n}: not JSON ({e}); fix or delete that line") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}, line {n}: a JSON {type(row).__name__}, not an object; fix or delete that line")
        rows.append(row)
    return rows
