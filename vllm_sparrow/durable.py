"""Writes that survive kill -9, power loss and full disks at any moment.

Every artifact a long job produces goes through here:
- whole files (checkpoints, shards, manifests, configs, reports): `atomic_write_*` writes a temp
  file in the same folder, fsyncs it, renames it over the target and fsyncs the folder, so a
  reader finds the old file or the new one, never half of either;
- JSONL rows (caption rows, benchmark records, logs): `append_jsonl` writes one whole line and
  fsyncs; `read_jsonl` treats a last line without its newline as torn (a write cut short),
  truncates it from the file and leaves its item to be redone. A bad line that did end in a
  newline is not a torn write: it is reported with its line number.
A write that fails (a full disk, a quota, a file-size limit) raises `DurableWriteError`, which
names the file and says what to do; the previous file, or the JSONL as it was before the row,
is left as it was.

Test hook: SPARROW_KILL_AT_WRITE=N kills the process with SIGKILL half way through its N-th
durable write (half the bytes written), so tests can tear a write at a known point;
SPARROW_KILL_AT_WRITE=N:text counts only writes to files whose name contains `text`.
"""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path
from typing import Any, Callable

from . import envs

_writes = 0  # durable writes counted by the kill hook in this process


class DurableWriteError(OSError):
    """A durable write failed (disk full, quota, file-size limit, ...); nothing was lost: the
    previous file (or the JSONL without the new row) is still there. Raised from the OSError."""

    def __init__(self, path: Path, cause: OSError, kept: str) -> None:
        super().__init__(cause.errno, f"could not write {path}: {cause.strerror or cause}. {kept} "
                         "Free disk space (or raise the quota / file-size limit) and rerun the same "
                         "command: it resumes from what was written.")
        self.path = path


def _dies_here(path: Path) -> bool:
    """True when the SPARROW_KILL_AT_WRITE hook says this write (to `path`) is the fatal one."""
    global _writes
    at = envs.SPARROW_KILL_AT_WRITE  # None, or (N, text)
    if at is None:
        return False
    n, text = at
    if text not in path.name:
        return False
    _writes += 1
    return _writes == n


def _write_or_die(path: Path, f, data: bytes) -> None:
    """All of data to f (a raw or buffered binary file); the hook's fatal write puts half of it
    on disk first, then dies."""
    if _dies_here(path):
        _write_all(f, data[: len(data) // 2])
        f.flush()
        os.fsync(f.fileno())
        os.kill(os.getpid(), signal.SIGKILL)
    _write_all(f, data)


def _write_all(f, data: bytes) -> None:
    view = memoryview(data)
    while view:  # a raw file may take part of it (a limit reached): the next write raises
        view = view[f.write(view) :]


def _die_with_half_file(path: Path, tmp: Path) -> None:
    """The hook for a file another library wrote to `tmp`: die with half of it there."""
    if _dies_here(path):
        os.truncate(tmp, tmp.stat().st_size // 2)
        os.kill(os.getpid(), signal.SIGKILL)


def _os_error(e: BaseException) -> OSError | None:
    """The operating system's error behind a failed save: e itself, one it was raised from or
    during, or the "(os error N)" a Rust library (safetensors) puts in its message."""
    seen = e
    while seen is not None:
        if isinstance(seen, OSError):
            return seen
        seen = seen.__cause__ or seen.__context__
    found = re.search(r"os error (\d+)", str(e))
    if found:
        code = int(found.group(1))
        return OSError(code, os.strerror(code))
    return None


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # not supported here (e.g. some network filesystems)
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _umask_mode() -> int:
    """The mode open() gives a new file under the process's umask (0644 under the usual 022)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def atomic_save(path: str | Path, save: Callable[[Path], None]) -> Path:
    """save(tmp_path) writes the file (torch.save, safetensors...); it lands at `path` whole,
    with the mode the umask gives new files (safetensors creates 0600, which a server running
    as another user could not read)."""
    path = Path(path)
    # one temp name per process: processes that write the same file together (the top manifest
    # of a capture split over processes) would otherwise rename each other's temp file away
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        save(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())  # the bytes are on disk before the name points at them
        os.chmod(tmp, _umask_mode())
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        cause = None if isinstance(e, DurableWriteError) else _os_error(e)
        if cause is not None:
            kept = f"The previous {path.name} is unchanged." if path.exists() else f"No {path.name} was written."
            raise DurableWriteError(path, cause, kept) from e
        raise
    _fsync_dir(path.parent)  # the rename itself survives a power loss
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
        with open(tmp, "wb") as f:  # a file object: a failed write keeps its OSError as the context
            torch.save(obj, f)
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
    with open(path, "ab", buffering=0) as f:  # unbuffered: nothing left to flush after a failure
        size = os.fstat(f.fileno()).st_size
        try:
            _write_or_die(path, f, data)
            os.fsync(f.fileno())
        except OSError as e:  # a part of the row may be on disk: cut it off again
            _truncate_quietly(f.fileno(), size)
            raise DurableWriteError(path, e, f"{path.name} keeps its earlier rows.") from e


def _truncate_quietly(fd: int, size: int) -> None:
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    except OSError:  # the next read cuts a torn tail anyway
        pass


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
