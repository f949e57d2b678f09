"""A capture split over N processes (`sparrow capture --shard I/N`, here 3 real processes running
at once into one directory) reads back as the capture one process makes: the same samples, once
each, in the same order, with the same tensors; bad samples are skipped by the part that owns
them. A split capture refuses to be extended unsplit or split otherwise. States are stored in
bfloat16 by default; before the first sample the capture prints its size estimate, which bounds
what it stores, and it refuses (writing nothing) when the disk's free space is smaller."""

import json
import os
import subprocess
import sys

import pytest
import torch

from vllm_sparrow.training import capture as capture_module
from vllm_sparrow.training.capture import CaptureConfig, CaptureRefused, capture
from vllm_sparrow.training.shards import CaptureMismatch, Part, ShardReader
from support.clip_data import dataset

KIND = "qwen2_5_vl"


@pytest.fixture(scope="module")
def data(workdir, small_clips, target_dirs):
    rows = [{"video": f"v{i}.mp4", "prompt": f"describe clip {i}"} for i in range(6)]
    rows.insert(4, {"video": "missing.mp4", "prompt": "x"})  # line 4: part 1 of 3 skips it
    rows.append({"prompt": "describe the red square moving left", "response": "it moves left",
                 "response_ids": [40, 41, 42, 43, 44]})
    jsonl = dataset(workdir / "split-capture", small_clips, rows)
    return dict(root=jsonl.parent, target=target_dirs(KIND), lines=len(rows))


def _cfg(d, out, **kw):
    return CaptureConfig(target=str(d["target"]), data=str(d["root"] / "data.jsonl"), out=str(out), num_frames=4,
                         max_new_tokens=8, shard_size=2, **kw)


@pytest.fixture(scope="module")
def whole(data):
    out = data["root"] / "whole"
    capture(_cfg(data, out), progress=False)
    return out


@pytest.fixture(scope="module")
def split(data):
    """Three `sparrow capture --shard I/3` processes started together on one directory."""
    out = data["root"] / "split"
    args = ["--target", str(data["target"]), "--data", str(data["root"] / "data.jsonl"), "--out", str(out),
            "--frames", "4", "--max-new-tokens", "8", "--shard-size", "2"]
    procs = [subprocess.Popen([sys.executable, "-m", "vllm_sparrow.cli", "capture", *args, "--shard", f"{i}/3"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy())
             for i in range(3)]
    results = [p.communicate(timeout=600) + (p.returncode,) for p in procs]
    for stdout, stderr, code in results:
        assert code == 0, stdout[-2000:] + stderr[-3000:]
    return out, [r[0] for r in results]


def test_three_processes_capture_what_one_does(whole, split):
    one, three = ShardReader(whole), ShardReader(split[0])
    assert [i for _, i in three.where] == [i for _, i in one.where] == [0, 1, 2, 3, 5, 6, 7]
    for a, b in zip(one, three):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    part1 = json.loads((split[0] / "part-1-of-3" / "manifest.json").read_text())
    assert list(part1["skipped"]) == ["4"] and "missing file" in part1["skipped"]["4"]
    assert "kept 2 samples; skipped: 1 missing file" in split[1][1]


def test_states_are_stored_in_bfloat16_by_default(whole):
    sample = ShardReader(whole)[0]
    assert sample["text_hidden"].dtype == sample["visual_hidden"].dtype == torch.bfloat16


def test_a_split_capture_refuses_other_splits_and_bad_parts(data, split):
    out = split[0]
    with pytest.raises(CaptureMismatch, match=r"split into 3 parts \(run with --shard I/3\)"):
        capture(_cfg(data, out), progress=False)
    with pytest.raises(CaptureMismatch, match="split into 3 parts"):
        capture(_cfg(data, out, shard="0/2"), progress=False)
    with pytest.raises(ValueError, match="I must be in 0..N-1"):
        Part.parse("3/3")
    with pytest.raises(ValueError, match="give I/N"):
        Part.parse("half")
    assert capture(_cfg(data, out, shard="2/3"), progress=False).kept == 2  # a finished part: nothing to redo


def test_the_size_estimate_bounds_what_is_stored_and_is_printed(data, whole, capsys, tmp_path):
    capture(_cfg(data, tmp_path / "again"), progress=False)
    line = next(s for s in capsys.readouterr().out.splitlines() if s.startswith("capture: about"))
    assert "sample 0: 32 visual + " in line and f"for {data['lines']} samples" in line and "free at" in line
    reader = ShardReader(whole)
    stored = [sum(t.numel() * t.element_size() for t in reader[i].values()) for i in range(len(reader))]
    from vllm_sparrow.training.data import read_samples
    from vllm_sparrow.training.target_runner import HFTarget

    target = HFTarget(str(data["target"]))
    samples = list(read_samples(data["root"] / "data.jsonl"))
    cfg = _cfg(data, tmp_path / "unused")
    estimate, _ = capture_module.estimate_sample_bytes(cfg, target, samples[0])
    assert max(stored[:4]) <= estimate <= 1.5 * max(stored[:4])  # responses up to max_new_tokens: an upper bound
    given, basis = capture_module.estimate_sample_bytes(cfg, target, samples[-1])  # its response_ids: exact size
    assert "its response" in basis and given == stored[-1]


def test_a_capture_the_disk_cannot_hold_is_refused_before_writing(data, tmp_path, monkeypatch):
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(capture_module.shutil, "disk_usage", lambda path: usage(10 << 20, 10 << 20, 4096))
    out = tmp_path / "full"
    with pytest.raises(CaptureRefused, match=r"needs about .* and the disk has 4\.0 KiB free.*--no-disk-check"):
        capture(_cfg(data, out), progress=False)
    assert not list(out.glob("shard-*"))
    assert capture(_cfg(data, out, disk_check=False, limit=1), progress=False).kept == 1
