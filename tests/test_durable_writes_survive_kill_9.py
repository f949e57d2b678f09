"""durable.py, under which every long job writes: a process killed with SIGKILL half way through
any of its writes leaves the previous whole file (atomic writes) or a torn last line that the next
read cuts off (JSONL appends); file bytes are fsynced before the rename and the folder after it;
a full disk (a file-size limit in a child process) leaves the previous file whole, or the JSONL
without the row, and raises an error that says what to do; a bad line that is not a torn write is
reported by line number."""

import json
import os
import resource
import signal
import subprocess
import sys

import pytest

from vllm_sparrow import durable
from vllm_sparrow.durable import append_jsonl, atomic_write_json, read_jsonl


def _killed(code: str, *args: str, kill_at: str = "1") -> subprocess.CompletedProcess:
    env = {**os.environ, "SPARROW_KILL_AT_WRITE": kill_at}
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=120)


def test_a_kill_during_an_atomic_write_keeps_the_previous_file_whole(tmp_path):
    path = tmp_path / "manifest.json"
    atomic_write_json(path, {"shards": [1, 2]})
    done = _killed("import sys; from vllm_sparrow.durable import atomic_write_json; "
                   "atomic_write_json(sys.argv[1], {'shards': list(range(10000))})", str(path))
    assert done.returncode == -signal.SIGKILL
    assert json.loads(path.read_text()) == {"shards": [1, 2]}


def test_a_kill_during_an_append_leaves_a_torn_line_that_the_next_run_cuts(tmp_path):
    path = tmp_path / "rows.jsonl"
    append_jsonl(path, {"id": "a"})
    done = _killed("import sys; from vllm_sparrow.durable import append_jsonl; "
                   "append_jsonl(sys.argv[1], {'id': 'b', 'caption': 'x' * 1000})", str(path))
    assert done.returncode == -signal.SIGKILL
    assert not path.read_bytes().endswith(b"\n")  # torn
    append_jsonl(path, {"id": "c"})  # the next writer repairs the tail first
    assert [r["id"] for r in read_jsonl(path)] == ["a", "c"]
    assert path.read_text().count("\n") == 2


# A job that interleaves both kinds of write, as captioning and training do: six rounds of
# (append a row, rewrite the manifest, save a checkpoint with torch).
JOB = """
import sys
from pathlib import Path
from vllm_sparrow.durable import append_jsonl, atomic_torch_save, atomic_write_json
d = Path(sys.argv[1])
for i in range(6):
    append_jsonl(d / "rows.jsonl", {"i": i, "pad": "x" * 500})
    atomic_write_json(d / "manifest.json", {"rows": i + 1, "pad": list(range(300 * (i + 1)))})
    atomic_torch_save(d / "checkpoint.pt", {"step": i + 1, "pad": list(range(2000))})
"""


@pytest.mark.parametrize("kill_at", [1, 2, 3, 5, 9, 13, 17])
def test_a_kill_at_any_write_of_a_job_leaves_every_file_whole_or_its_predecessor(tmp_path, kill_at):
    """Write n of the job is torn: round (n - 1) // 3, kind (n - 1) % 3 (row, manifest, checkpoint)."""
    import torch

    done = _killed(JOB, str(tmp_path), kill_at=str(kill_at))
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    rnd, kind = divmod(kill_at - 1, 3)
    rows = read_jsonl(tmp_path / "rows.jsonl")  # every surviving line parses
    assert [r["i"] for r in rows] == list(range(rnd + (kind > 0)))
    manifest = tmp_path / "manifest.json"
    expect_manifest = rnd + (kind > 1)
    assert (json.loads(manifest.read_text())["rows"] if manifest.exists() else 0) == expect_manifest
    ckpt = tmp_path / "checkpoint.pt"
    assert (torch.load(ckpt)["step"] if ckpt.exists() else 0) == rnd
    torn = {1: [".manifest.json"], 2: [".checkpoint.pt"]}.get(kind, [])
    temps = sorted(p.name.rsplit(".", 2)[0] for p in tmp_path.glob(".*.tmp"))  # .NAME.PID.tmp
    assert temps == torn  # at most the torn write's temp file


def test_file_and_folder_are_fsynced_around_the_rename(tmp_path, monkeypatch):
    """The bytes reach the disk before the name points at them, and the rename reaches it before
    the write returns; an appended row is fsynced before append_jsonl returns."""
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", str(src), str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(durable.os, "fsync", fsync)
    monkeypatch.setattr(durable.os, "replace", replace)
    path = tmp_path / "manifest.json"
    atomic_write_json(path, {"a": 1})
    tmp = str(tmp_path / f".manifest.json.{os.getpid()}.tmp")
    assert events == [("fsync", tmp), ("replace", tmp, str(path)), ("fsync", str(tmp_path))]
    events.clear()
    durable.atomic_torch_save(tmp_path / "c.pt", {"x": 1})
    assert [e[0] for e in events] == ["fsync", "replace", "fsync"] and events[-1] == ("fsync", str(tmp_path))
    events.clear()
    append_jsonl(tmp_path / "rows.jsonl", {"id": 1})
    assert events == [("fsync", str(tmp_path / "rows.jsonl"))]


FULL_DISK = """
import json, resource, signal, sys
from vllm_sparrow.durable import DurableWriteError, append_jsonl, atomic_write_json
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[3]), resource.RLIM_INFINITY))
try:
    if sys.argv[1] == "atomic":
        atomic_write_json(sys.argv[2], {"rows": list(range(100000))})
    else:
        append_jsonl(sys.argv[2], {"id": "big", "caption": "x" * 100000})
except DurableWriteError as e:
    print(e.strerror)
    sys.exit(3)
"""


@pytest.mark.parametrize("kind", ["atomic", "append"])
def test_a_full_disk_keeps_the_previous_file_and_says_what_to_do(tmp_path, kind):
    path = tmp_path / ("manifest.json" if kind == "atomic" else "rows.jsonl")
    if kind == "atomic":
        atomic_write_json(path, {"rows": [1, 2, 3]})
    else:
        append_jsonl(path, {"id": "a"})
        append_jsonl(path, {"id": "b"})
    before = path.read_bytes()
    limit = len(before) + 4096  # room for a little more, not for the new contents
    run = subprocess.run([sys.executable, "-c", FULL_DISK, kind, str(path), str(limit)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 3, (run.returncode, run.stdout, run.stderr[-2000:])
    assert str(path) in run.stdout and "Free disk space" in run.stdout and "rerun" in run.stdout
    assert path.read_bytes() == before  # the old file whole, no torn row
    assert not list(tmp_path.glob(".*.tmp"))  # nothing half-written left behind
    assert resource.getrlimit(resource.RLIMIT_FSIZE)[0] == resource.RLIM_INFINITY  # (the child's alone)


def test_the_cli_reports_a_full_disk_as_an_error_message(tmp_path):
    """`sparrow init-draft` into a folder it cannot fill: one line naming the file, exit 1, no
    traceback."""
    from sparrow_world.tiny_targets import build_tiny_target

    target = build_tiny_target("llama", tmp_path / "target")
    code = ("import resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
            "resource.setrlimit(resource.RLIMIT_FSIZE, (2048, resource.RLIM_INFINITY)); "
            "from vllm_sparrow.cli import main; sys.exit(main(sys.argv[1:]))")
    run = subprocess.run([sys.executable, "-c", code, "init-draft", "--target", str(target),
                          "--out", str(tmp_path / "draft")], capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stderr[-2000:]
    assert "Traceback" not in run.stderr and "Free disk space" in run.stderr, run.stderr[-2000:]
    assert "model.safetensors" in run.stderr


def test_the_kill_hook_counts_only_matching_files(tmp_path):
    code = ("import sys; from pathlib import Path; from vllm_sparrow.durable import atomic_write_text; "
            "d = Path(sys.argv[1]); [atomic_write_text(d / f'{n}-{i}.txt', 'x') for i in range(3) for n in ('log', 'shard')]")
    done = _killed(code, str(tmp_path), kill_at="2:shard")
    assert done.returncode == -signal.SIGKILL
    assert sorted(p.name for p in tmp_path.glob("*.txt")) == ["log-0.txt", "log-1.txt", "shard-0.txt"]


def test_a_bad_line_that_is_not_a_torn_tail_is_reported_by_number(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"id": 1}\n[1, 2]\n{"id": 3}\n')
    with pytest.raises(ValueError, match="line 2: a JSON list, not an object"):
        read_jsonl(path)
    path.write_text('{"id": 1}\n{oops\n')
    with pytest.raises(ValueError, match="line 2: not JSON"):
        read_jsonl(path)



@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o077, 0o600)])
def test_written_files_take_the_mode_the_umask_gives(tmp_path, umask, mode):
    """Exported weights and capture shards (safetensors) were written 0600 whatever the umask, so a
    server running as another user could not read a draft."""
    import torch

    from vllm_sparrow.durable import atomic_save_safetensors, atomic_torch_save

    old = os.umask(umask)
    try:
        paths = [atomic_save_safetensors(tmp_path / "w.safetensors", {"w": torch.zeros(2)}),
                 atomic_torch_save(tmp_path / "c.pt", {"step": 1}), atomic_write_json(tmp_path / "c.json", {})]
        append_jsonl(tmp_path / "rows.jsonl", {"id": 1})
    finally:
        os.umask(old)
    for path in paths + [tmp_path / "rows.jsonl"]:
        assert path.stat().st_mode & 0o777 == mode, (path.name, oct(path.stat().st_mode & 0o777))


WRITERS = """
import sys
from vllm_sparrow.durable import atomic_write_json
for i in range(300):
    atomic_write_json(sys.argv[1], {"writer": sys.argv[2], "i": i})
"""


def test_processes_writing_one_file_together_never_clash(tmp_path):
    """Every process of a split capture writes the same top manifest as it starts: with one temp
    name for all, one process renamed another's temp file away and that one died (ENOENT)."""
    path = tmp_path / "manifest.json"
    procs = [subprocess.Popen([sys.executable, "-c", WRITERS, str(path), str(w)], stderr=subprocess.PIPE, text=True)
             for w in range(3)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errors
    assert json.loads(path.read_text())["i"] == 299  # whole: the last write of one of them
    assert not list(tmp_path.glob(".*.tmp"))
