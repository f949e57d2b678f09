"""durable.py, under which every long job writes: a process killed with SIGKILL half way through
a write leaves the previous whole file (atomic writes) or a torn last line that the next read
cuts off (JSONL appends); a bad line that is not a torn write is reported by line number."""

import json
import os
import signal
import subprocess
import sys

import pytest

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
