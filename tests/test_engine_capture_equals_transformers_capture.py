"""`sparrow capture --engine` runs the target in vLLM (many samples per batched, chunked prefill;
responses written by the engine) and stores what the transformers capture stores: the same kept
samples and skip reasons, the same token ids (prompt with placeholders expanded, then the
response: the target's own greedy answer where the sample has none), the same rotary positions
the EAGLE-style baseline reads, and the same states (final at text positions and, for that
baseline, at visual ones; IVSB layer at visual ones; EAGLE-3 auxiliary layers everywhere) to
2e-3 in float32, as the captured states are checked against what vLLM hands the proposer.
Prefill steps of 64 tokens split samples across steps and batch several samples in one step;
chunks of 3 samples need several engine runs, and two prompts on one clip share its decoded
frames. An engine capture killed with SIGKILL while writing a shard takes its engine processes
with it and resumes to the uninterrupted capture."""

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import psutil
import pytest
import torch

from support.capture_data import capture_data

from vllm_sparrow.training.capture import CaptureConfig, capture
from vllm_sparrow.training.shards import ShardReader

ENGINE = {"dtype": "float32", "max_num_seqs": 4, "max_num_batched_tokens": 64, "enforce_eager": True}


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl"])
def captures(request, workdir, target_dirs):
    kind = request.param
    data = capture_data(workdir / f"engine-capture-{kind}", kind)
    base = dict(target=str(target_dirs(kind)), data=str(data), num_frames=16, max_new_tokens=8, max_seq_len=160,
                store_dtype="float32", eagle3=True, eagle_baseline=True, shard_size=2)
    hf = capture(CaptureConfig(out=str(data.parent / "hf"), **base), progress=False)
    engine = capture(CaptureConfig(out=str(data.parent / "engine"), engine=True, batch=3, engine_args=ENGINE, **base),
                     progress=False)
    return kind, (hf, data.parent / "hf"), (engine, data.parent / "engine")


def test_the_same_samples_are_kept_and_skipped_for_the_same_reasons(captures):
    _, (hf, hf_dir), (engine, engine_dir) = captures
    assert engine.kept == hf.kept >= 4 and engine.skipped == hf.skipped
    assert set(hf.skipped) == {"missing file", "over-long sample"}
    assert [i for _, i in ShardReader(engine_dir).where] == [i for _, i in ShardReader(hf_dir).where]


def test_tokens_and_states_equal_the_transformers_capture(captures):
    kind, (_, hf_dir), (_, engine_dir) = captures
    for a, b in zip(ShardReader(hf_dir), ShardReader(engine_dir)):
        assert a.keys() == b.keys()
        for key in ("token_ids", "is_visual", "prompt_len", "aux_layers", "positions"):
            assert torch.equal(a[key], b[key]), key
        for key in ("text_hidden", "visual_hidden", "aux_hidden", "visual_final"):
            torch.testing.assert_close(b[key], a[key], atol=2e-3, rtol=2e-3, msg=f"{kind} {key}")
    video = ShardReader(engine_dir)[0]
    assert int(video["is_visual"].sum()) > 0 and video["visual_hidden"].shape[0] == int(video["is_visual"].sum())


def _tagged(tag: str) -> list[psutil.Process]:
    """Live processes whose environment carries `tag` (the killed command's engine core and
    worker inherit it)."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("SPARROW_TEST_TAG") == tag and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


def test_a_killed_engine_capture_leaves_no_engine_and_resumes_to_the_same_capture(captures, target_dirs):
    """`sparrow capture --engine` as a user runs it, killed half way through its second shard."""
    kind, _, (_, engine_dir) = captures
    if kind != "qwen2_5_vl":
        pytest.skip("one target is enough: writing and resuming do not depend on the target's kind")
    data, out = engine_dir.parent / "data.jsonl", engine_dir.parent / "engine-killed"
    cmd = [sys.executable, "-m", "vllm_sparrow.cli", "capture", "--target", str(target_dirs(kind)), "--data", str(data),
           "--out", str(out), "--frames", "16", "--max-new-tokens", "8", "--max-seq-len", "160",
           "--store-dtype", "float32", "--eagle3", "--eagle-baseline", "--shard-size", "2", "--engine",
           "--batch", "3", "--engine-args", json.dumps(ENGINE)]
    tag = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}  # as a user runs it:
    env |= {"SPARROW_KILL_AT_WRITE": "2:shard-", "SPARROW_TEST_TAG": tag}  # an engine core process, a worker
    log = out.parent / "engine-killed.log"  # a file, not a pipe: vLLM's output would fill an unread pipe
    killed = subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    seen = set()  # the command, its engine core and worker, while they run
    while killed.poll() is None:
        seen |= {p.pid for p in _tagged(tag)}
        time.sleep(0.5)
    assert killed.returncode == -signal.SIGKILL, log.read_text()[-3000:]
    assert len(seen) >= 3, "the engine ran in the command's own process: nothing to outlive it"
    deadline = time.monotonic() + 30
    while _tagged(tag) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = _tagged(tag)
    for p in left:
        p.kill()
    assert not left, f"engine processes outlived the killed capture: {[p.name() for p in left]}"
    assert [s["samples"] for s in ShardReader(out).manifest.shards] == [[0, 1]]  # the torn shard unlisted

    report = capture(CaptureConfig(target=str(target_dirs(kind)), data=str(data), out=str(out), num_frames=16,
                                   max_new_tokens=8, max_seq_len=160, store_dtype="float32", eagle3=True,
                                   eagle_baseline=True, shard_size=2, engine=True, batch=3, engine_args=ENGINE),
                     progress=False)  # the rerun (in process: no second interpreter to start)
    assert report.resumed_from == 2  # shard 0 (lines 0, 1); the killed write came before line 4 was judged
    resumed, whole = ShardReader(out), ShardReader(engine_dir)
    assert [i for _, i in resumed.where] == [i for _, i in whole.where]  # every sample once, in order
    for a, b in zip(whole, resumed):
        assert a.keys() == b.keys()
        for key in a:
            if a[key].is_floating_point():
                # the resumed run batches its first samples with other neighbours, so their prefill
                # chunks split elsewhere and float32 sums run in another order: states agree to
                # reduction-order noise (seen: 7e-5 on a CPU whose GEMMs depend on the batch's rows)
                torch.testing.assert_close(b[key], a[key], atol=1e-4, rtol=1e-4, msg=key)
            else:
                assert torch.equal(b[key], a[key]), key  # token ids, flags, positions: exactly
