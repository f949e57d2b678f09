"""`sparrow capture`: bad samples are skipped and counted with their reason (the run goes on),
shards round-trip what the target computed, and a capture killed with SIGKILL while writing a
shard, then again while its rerun writes the manifest, resumes where it stopped without redoing
finished shards or losing samples."""

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from vllm_sparrow.training.capture import CaptureConfig, capture
from vllm_sparrow.training.shards import CaptureMismatch, ShardReader

KIND = "qwen2_5_vl"


@pytest.fixture(scope="module")
def dataset(workdir, target_dirs):
    from sparrow_world.synthetic_clip import write_synthetic_clip

    root = workdir / "capture-data"
    root.mkdir()
    for i in range(3):
        write_synthetic_clip(root / f"v{i}.mp4", 4, width=112, height=112, seed=i)
    write_synthetic_clip(root / "long.mp4", 16, width=112, height=112, seed=9)
    Image.fromarray(np.full((112, 112, 3), 90, np.uint8)).save(root / "im.png")
    Image.fromarray(np.full((10, 2400, 3), 90, np.uint8)).save(root / "thin.png")  # the processor refuses it
    (root / "broken.mp4").write_bytes(b"\x00not a video at all")
    good = [
        {"video": "v0.mp4", "prompt": "describe the video"},
        {"video": "v1.mp4", "conversations": [{"from": "human", "value": "<video>\nwhat moves?"},
                                              {"from": "gpt", "value": "a red square moves left"}]},
        {"image_path": "im.png", "messages": [{"role": "user", "content": "what is in the picture"}]},
        {"prompt": "describe the red square moving left"},
        {"video": "v2.mp4", "prompt": "and now?"},
    ]
    bad = [
        {"video": "missing.mp4", "prompt": "x"},
        {"video": "broken.mp4", "prompt": "x"},
        {"video": "v0.mp4", "prompt": "x", "response": "   "},
        {"video": "long.mp4", "prompt": "too many frames for max_seq_len"},
    ]
    lines = [json.dumps(r) for r in good[:3] + bad[:2] + good[3:] + bad[2:]] + ["{oops"]
    lines.append(json.dumps({"image_path": "thin.png", "prompt": "what is this"}))
    (root / "data.jsonl").write_text("\n".join(lines) + "\n")
    return dict(root=root, target=target_dirs(KIND), good=good)


def _cfg(d, out, **kw):
    return CaptureConfig(target=str(d["target"]), data=str(d["root"] / "data.jsonl"), out=str(out),
                         num_frames=16, max_new_tokens=8, max_seq_len=120, shard_size=2,
                         store_dtype="float32", **kw)  # the round trip is checked exactly


@pytest.fixture(scope="module")
def captured(dataset, workdir):
    """The dataset captured in one uninterrupted run: (its report, its folder)."""
    out = workdir / "cap-a"
    return capture(_cfg(dataset, out), progress=False), out


def test_bad_samples_are_skipped_with_reasons_and_the_rest_kept(dataset, captured):
    report, out = captured
    assert report.kept == len(dataset["good"])
    assert report.skipped == {"missing file": 1, "undecodable media": 1, "empty response": 1,
                              "over-long sample": 1, "bad json": 1, "target error": 1}
    skipped = ShardReader(out).manifest.skipped
    assert "missing.mp4 does not exist" in skipped["3"] and "re-encode" in skipped["4"]
    assert skipped["10"].startswith("target error: ValueError") and "aspect ratio" in skipped["10"]


def test_resume_refuses_a_data_file_whose_captured_lines_changed(dataset, workdir):
    import shutil

    root = workdir / "capture-data-edited"
    shutil.copytree(dataset["root"], root)
    d = {**dataset, "root": root}
    cfg = CaptureConfig(**{**vars(_cfg(d, workdir / "cap-edit")), "limit": 2})
    assert capture(cfg, progress=False).kept == 2
    lines = (root / "data.jsonl").read_text().splitlines()
    (root / "data.jsonl").write_text("\n".join(lines + [json.dumps({"prompt": "one more line"})]) + "\n")
    assert capture(CaptureConfig(**{**vars(cfg), "limit": None}), progress=False).kept == len(dataset["good"]) + 1
    lines[0] = json.dumps({"video": "v0.mp4", "prompt": "an edited prompt"})
    (root / "data.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(CaptureMismatch, match="first 12 lines changed"):
        capture(CaptureConfig(**{**vars(cfg), "limit": None}), progress=False)


def test_shards_round_trip_the_target_states(dataset, captured):
    from vllm_sparrow.training.data import load_media, read_samples
    from vllm_sparrow.training.target_runner import HFTarget

    reader = ShardReader(captured[1])
    hf = HFTarget(str(dataset["target"]))
    row = next(read_samples(dataset["root"] / "data.jsonl"))  # v0.mp4, response by the target
    stored = reader[0]
    inputs = hf.encode(row.prompt, row.media_kind, load_media(row, 16))
    prompt_len = inputs["input_ids"].shape[1]
    assert int(stored["prompt_len"]) == prompt_len
    response = stored["token_ids"][prompt_len:].tolist()
    assert response == hf.answer(inputs, 8)  # the target's own greedy answer
    ids, final, layer, *_ = hf.states(inputs, response, 1)
    vis = stored["is_visual"]
    assert int(vis.sum()) == 32  # 4 frames of 112x112 through Qwen2.5-VL's processor
    torch.testing.assert_close(stored["text_hidden"], final[~vis])
    torch.testing.assert_close(stored["visual_hidden"], layer[vis])
    conv = reader[1]  # the dataset's answer is kept, ended with the end-of-turn token
    answer = hf.tokenizer("a red square moves left", add_special_tokens=False)["input_ids"]
    assert conv["token_ids"][int(conv["prompt_len"]):].tolist() == answer + hf.eos_ids[:1]


def _capture_killed(cfg, kill_at: str) -> subprocess.CompletedProcess:
    code = ("import json, sys; from vllm_sparrow.training.capture import CaptureConfig, capture; "
            "capture(CaptureConfig(**json.loads(sys.argv[1])), progress=False)")
    env = {**os.environ, "SPARROW_KILL_AT_WRITE": kill_at}
    return subprocess.run([sys.executable, "-c", code, json.dumps(vars(cfg))], env=env,
                          capture_output=True, text=True, timeout=600)


def test_capture_killed_while_writing_a_shard_resumes_where_it_stopped(dataset, workdir, captured):
    out = workdir / "cap-b"
    killed = _capture_killed(_cfg(dataset, out), "2:shard-")  # half of the second shard written
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    first = ShardReader(out).manifest
    assert [s["samples"] for s in first.shards] == [[0, 1]]  # the torn shard was never listed
    shard0 = (out / "shard-00000.safetensors").stat().st_mtime_ns
    again = _capture_killed(_cfg(dataset, out), "3:manifest")  # the rerun, in its third manifest write
    assert again.returncode == -signal.SIGKILL, again.stderr[-2000:]
    assert ShardReader(out).manifest.shards[0]["samples"] == [0, 1]  # the manifest reads whole
    report = capture(_cfg(dataset, out), progress=False)
    assert report.resumed_from >= 2 and report.kept == len(dataset["good"])
    assert (out / "shard-00000.safetensors").stat().st_mtime_ns == shard0  # finished work kept
    reference = ShardReader(captured[1])
    resumed = ShardReader(out)
    assert sorted(i for _, i in resumed.where) == sorted(i for _, i in reference.where)  # each once
    for pos in range(len(resumed)):  # every listed shard reads whole
        torch.testing.assert_close(resumed[pos]["text_hidden"], reference[pos]["text_hidden"])
    with pytest.raises(CaptureMismatch, match="num_frames"):
        capture(CaptureConfig(**{**vars(_cfg(dataset, out)), "num_frames": 8}), progress=False)


def test_capture_refuses_to_extend_a_capture_of_other_target_weights(workdir, dataset, target_dirs):
    """A target retrained in place (same path, new weights) must not add samples to a capture
    of its old self: the drafts would train on a mix of two targets."""
    import shutil

    from safetensors.torch import load_file, save_file

    target = workdir / "capture-retrained-target"
    shutil.copytree(dataset["target"], target)
    cfg = CaptureConfig(**{**vars(_cfg(dataset, workdir / "cap-retrained")), "target": str(target), "limit": 1})
    assert capture(cfg, progress=False).kept == 1
    weights = target / "model.safetensors"
    tensors = load_file(weights)
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] + 1.0
    save_file(tensors, weights, metadata={"format": "pt"})
    with pytest.raises(CaptureMismatch, match="target_weights"):
        capture(CaptureConfig(**{**vars(cfg), "limit": 2}), progress=False)


def test_weights_fingerprint_of_a_large_checkpoint_follows_its_content(tmp_path):
    """Large weight files are fingerprinted from samples (a 15 GB target must not be read whole at
    every capture start): a retrained file (new bytes throughout) changes it, a copy does not."""
    import numpy as np

    from vllm_sparrow.fingerprint import weights_fingerprint

    rng = np.random.default_rng(0)
    for name in ("a", "copy", "retrained"):
        (tmp_path / name).mkdir()
    weights = rng.bytes(6 << 20)  # over the 4 MiB whole-file limit
    (tmp_path / "a" / "model.safetensors").write_bytes(weights)
    (tmp_path / "copy" / "model.safetensors").write_bytes(weights)
    (tmp_path / "retrained" / "model.safetensors").write_bytes(rng.bytes(6 << 20))
    fingerprints = {name: weights_fingerprint(tmp_path / name) for name in ("a", "copy", "retrained")}
    assert fingerprints["a"] == fingerprints["copy"] != fingerprints["retrained"]
    assert weights_fingerprint("Qwen/Qwen2.5-VL-7B-Instruct") is None  # a hub id: nothing to read


def test_a_full_disk_stops_the_capture_with_a_message_and_keeps_the_manifest(dataset, workdir):
    """A shard that cannot be written is not a bad sample: `sparrow capture` stops, names the
    file and what to do, and the manifest still reads whole (a rerun resumes)."""
    out = workdir / "cap-full-disk"
    cfg = _cfg(dataset, out)
    code = ("import resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
            "resource.setrlimit(resource.RLIMIT_FSIZE, (8192, resource.RLIM_INFINITY)); "
            "from vllm_sparrow.cli import main; sys.exit(main(sys.argv[1:]))")
    args = ["capture", "--target", cfg.target, "--data", cfg.data, "--out", str(out), "--frames", "16",
            "--max-new-tokens", "8", "--max-seq-len", "120", "--shard-size", "2"]
    run = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=600)
    assert run.returncode == 1, run.stderr[-3000:]
    assert "shard-00000.safetensors" in run.stderr and "Free disk space" in run.stderr, run.stderr[-3000:]
    assert "Traceback" not in run.stderr
    manifest = ShardReader(out).manifest
    assert manifest.shards == [] and not any("target error" in m for m in manifest.skipped.values())
