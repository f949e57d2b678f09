"""`sparrow train` is seeded and resumable: a run killed with SIGKILL in the middle of saving a
checkpoint resumes from the previous one and ends with exactly the weights of an uninterrupted
run; a resume with other settings is refused; export writes the plugin draft from the
checkpoint."""

import json
import os
import signal
import subprocess
import sys
from dataclasses import asdict

import pytest
import torch

from vllm_sparrow.training.train import TrainConfig, train


def _cfg(capture, out, steps, **kw):
    return TrainConfig(capture=str(capture), out=str(out), steps=steps, lr=3e-3, mtp_steps=1,
                       visual_fraction=0.5, window_tokens=16, holdout=1, save_every=3, log_every=3, **kw)


def _weights(run):
    return torch.load(run / "checkpoint.pt", weights_only=False)["draft"]


def _train_killed(cfg, kill_at: str) -> subprocess.CompletedProcess:
    code = ("import json, sys; from vllm_sparrow.training.train import TrainConfig, train; "
            "train(TrainConfig(**json.loads(sys.argv[1])), progress=False)")
    env = {**os.environ, "SPARROW_KILL_AT_WRITE": kill_at}
    return subprocess.run([sys.executable, "-c", code, json.dumps(asdict(cfg))], env=env,
                          capture_output=True, text=True, timeout=600)


def test_run_killed_while_saving_resumes_and_equals_an_uninterrupted_one(small_capture, workdir):
    straight, resumed = workdir / "run-straight", workdir / "run-resumed"
    train(_cfg(small_capture, straight, 9), progress=False)
    killed = _train_killed(_cfg(small_capture, resumed, 9), "2:checkpoint")  # half of the step-6 save
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert torch.load(resumed / "checkpoint.pt", weights_only=False)["step"] == 3  # the old one, whole
    train(_cfg(small_capture, resumed, 9), progress=False)
    logged = [json.loads(x) for x in (resumed / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged if "loss" in r] == [3, 6, 9], "resumed at 3; rows past it redone once"
    a, b = _weights(straight), _weights(resumed)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    with pytest.raises(ValueError, match="mtp_steps"):
        train(TrainConfig(**{**vars(_cfg(small_capture, resumed, 12)), "mtp_steps": 2}), progress=False)


def test_export_writes_a_loadable_plugin_draft(small_capture, workdir):
    from vllm_sparrow.checkpoint import load_draft
    from vllm_sparrow.training.export import export_run

    run = workdir / "run-straight"
    out = export_run(run, workdir / "exported")
    draft = load_draft(out)
    for key, value in _weights(run).items():
        assert torch.equal(draft.state_dict()[key], value), key
    assert not any(k.startswith("bridge") for k in draft.state_dict())  # IVSB is training-only


def test_a_damaged_validation_shard_does_not_cost_the_exported_draft(small_capture, workdir):
    """The held-out sample's shard is unreadable: training goes on (bad samples are skipped) and
    the draft is exported; validation skips the unreadable held-out sample."""
    import shutil

    from vllm_sparrow.checkpoint import load_draft
    from vllm_sparrow.training.shards import ShardReader

    capture = workdir / "capture-damaged"
    shutil.copytree(small_capture, capture)
    shard = ShardReader(capture).where[-1][0]  # the held-out (last) sample's shard
    (capture / shard).write_bytes(b"\x00" * 64)
    result = train(_cfg(capture, workdir / "run-damaged", 3), progress=False)
    assert result.acceptance.drafts == 0  # nothing left to validate on
    assert load_draft(result.draft_dir) is not None
