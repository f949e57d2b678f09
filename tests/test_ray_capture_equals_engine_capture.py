"""`sparrow capture --engine --ray local --replicas 2` writes the capture the one-process
`sparrow capture --engine` writes: the same samples in the same order, the same skip reasons, and
equal tensors. Its driver killed with SIGKILL while listing its second shard (shards written but
never listed) takes its local cluster with it; the rerun deletes those shards, captures their
samples again and ends with that same capture. `--ray` without `--engine`, or with `--shard`, is refused
before anything starts, and so are the cluster knobs without `--ray`."""

import json
import signal

import pytest
import torch
from conftest import gpu_share
from support.ray_job_checks import sparrow, two_replicas, wait_gone

from vllm_sparrow.ray_jobs.capture import capture_on_ray
from vllm_sparrow.ray_jobs.options import BadRayOptions, RayOptions
from vllm_sparrow.training.capture import CaptureConfig, capture
from vllm_sparrow.training.shards import ShardReader, load_manifest

KIND = "qwen2_5_vl"
ENGINE = {"dtype": "float32", "max_num_seqs": 4, "enforce_eager": True, **gpu_share()}


@pytest.fixture(scope="module")
def data(workdir, target_dirs):
    from sparrow_world.synthetic_clip import write_synthetic_clip

    root = workdir / "ray-capture"
    root.mkdir()
    lines = []
    for i in range(6):
        write_synthetic_clip(root / f"v{i}.mp4", 4, width=112, height=112, seed=30 + i)
        lines.append({"video": f"v{i}.mp4", "prompt": f"describe clip {i}"})
    lines.insert(4, {"video": "missing.mp4", "prompt": "x"})
    lines.append({"prompt": "describe the red square moving left", "response_ids": [40, 41, 42, 43, 44]})
    (root / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return root, target_dirs(KIND)


def _args(data, out):
    root, target = data
    return ["capture", "--engine", "--target", str(target), "--data", str(root / "data.jsonl"), "--out", str(out),
            "--frames", "4", "--max-new-tokens", "8", "--batch", "2", "--engine-args", json.dumps(ENGINE)]


@pytest.fixture(scope="module")
def one_process(data):
    root, target = data
    capture(CaptureConfig(target=str(target), data=str(root / "data.jsonl"), out=str(root / "one"), num_frames=4,
                          max_new_tokens=8, batch=2, engine=True, engine_args=ENGINE), progress=False)
    return root / "one"


@pytest.fixture(scope="module")
def on_ray(data):
    """The Ray capture, its driver killed while writing the manifest that lists its second shard
    (the manifest's writes: created, data file noted, the missing clip skipped, shard 1, shard 2),
    then rerun."""
    out = data[0] / "ray"
    cmd = [*_args(data, out), *two_replicas()]
    killed = sparrow(cmd, env={"SPARROW_KILL_AT_WRITE": "5:manifest"})
    stdout, stderr = killed.communicate(timeout=600)
    assert killed.returncode == -signal.SIGKILL, stdout[-2000:] + stderr[-3000:]
    left = wait_gone(killed.pid, 10, killed.tree)
    after_kill = (load_manifest(out), sorted(p.name for p in out.glob("shard-*")), left)
    rerun = sparrow(cmd)
    stdout, stderr = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, stdout[-3000:] + stderr[-3000:]
    return out, after_kill, stdout, wait_gone(rerun.pid, 0, rerun.tree)


def test_the_ray_capture_equals_the_one_process_capture(one_process, on_ray):
    out = on_ray[0]
    one, ray = ShardReader(one_process), ShardReader(out)
    assert [i for _, i in ray.where] == [i for _, i in one.where] == [0, 1, 2, 3, 5, 6, 7]
    for a, b in zip(one, ray):
        assert a.keys() == b.keys()
        for k in a:
            _assert_same_capture(k, a[k], b[k])
    assert load_manifest(out).skipped == load_manifest(one_process).skipped
    assert "missing file" in load_manifest(out).skipped["4"]


def _assert_same_capture(key: str, a, b) -> None:
    """Token ids and masks equal; hidden states equal up to one bfloat16 rounding step. Each Ray
    replica batches its own share of the samples, so the target's float32 forward runs at other
    batch shapes than the one-process capture's and can differ in the last float32 bits, which
    the stored bfloat16 then rounds to the neighbouring value (seen: 1 ulp, e.g. 0.125 at 45)."""
    if not a.is_floating_point():
        assert torch.equal(a, b), key
        return
    torch.testing.assert_close(a.float(), b.float(), rtol=2**-7, atol=2**-7, msg=key)


def test_a_killed_driver_takes_its_cluster_and_the_rerun_resumes(on_ray):
    out, (manifest, shards, left), stdout, left_after = on_ray
    assert not left, f"processes of the killed command still run 10 s later: {left}"
    # the first shard listed; the second, at least, written and never listed (replicas run ahead)
    assert len(manifest.shards) == 1 and len(shards) >= 2
    resumed = f"kept 7 samples; skipped: 1 missing file (resumed after {len(manifest.done())} done)"
    assert resumed in stdout, stdout[-2000:]
    final = load_manifest(out)
    assert sorted(p.name for p in out.glob("shard-*")) == sorted(s["file"] for s in final.shards)
    assert not left_after, left_after


def test_ray_needs_the_engine_capture_and_replaces_shards(data, tmp_path):
    root, target = data
    base = dict(target=str(target), data=str(root / "data.jsonl"), out=str(tmp_path / "x"))
    local = RayOptions(ray="local")
    with pytest.raises(BadRayOptions, match="add --engine"):
        capture_on_ray(CaptureConfig(**base), local, progress=False)
    with pytest.raises(BadRayOptions, match="drop --shard"):
        capture_on_ray(CaptureConfig(**base, engine=True, shard="0/2"), local, progress=False)
    with pytest.raises(BadRayOptions, match="need --ray"):
        capture_on_ray(CaptureConfig(**base, engine=True), RayOptions(replicas=2), progress=False)
    with pytest.raises(BadRayOptions, match="needs --ray"):  # the Ray form never runs without a cluster
        capture_on_ray(CaptureConfig(**base, engine=True), RayOptions(), progress=False)
    assert not (tmp_path / "x").exists()
    cli = sparrow([a for a in _args(data, tmp_path / "y") if a != "--engine"] + ["--ray", "local"])
    stdout, stderr = cli.communicate(timeout=120)
    assert cli.returncode == 2 and "error: --ray runs the engine capture: add --engine" in stderr, stdout + stderr
    assert not (tmp_path / "y").exists()  # refused before anything was written
    cli = sparrow(_args(data, tmp_path / "z") + ["--replicas", "2"])  # the one-process capture, given a cluster knob
    stdout, stderr = cli.communicate(timeout=120)
    assert cli.returncode == 2 and "need --ray" in stderr, stdout + stderr
    assert not (tmp_path / "z").exists()
