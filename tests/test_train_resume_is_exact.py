"""`sparrow train` is seeded and resumable: a run killed with SIGKILL in the middle of saving a
checkpoint, or of writing a log row, or at random moments of the training loop, resumes from
the last whole checkpoint and ends with exactly the weights of an uninterrupted run; a resume
with other settings is refused; export writes the plugin draft from the checkpoint."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import asdict

import pytest
import torch

from vllm_sparrow.training.train import TrainConfig, train


def _cfg(capture, out, steps, **kw):
    return TrainConfig(capture=str(capture), out=str(out), steps=steps, lr=3e-3, mtp_steps=1,
                       visual_fraction=0.5, window_tokens=16, holdout=1, save_every=3, log_every=3, **kw)


def _weights(run):
    return torch.load(run / "checkpoint.pt", weights_only=False)["draft"]


TRAIN = ("import json, sys; from vllm_sparrow.training.train import TrainConfig, train; "
         "train(TrainConfig(**json.loads(sys.argv[1])), progress=False)")


def _child_env(**extra) -> dict:
    """A child run's environment: as many threads as this process's runs (the references, the
    resumes) have. Another test in this worker may have set torch's threads for the process (the
    demo build's target training sets 2, and vLLM's CPU worker then stops any change), and a
    step's last bits depend on how many threads sum it (a CI run failed so)."""
    return {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads()), **extra}


def _train_killed(cfg, kill_at: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", TRAIN, json.dumps(asdict(cfg))],
                          env=_child_env(SPARROW_KILL_AT_WRITE=kill_at), capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def straight(small_capture, workdir):
    """Uninterrupted runs of 9 and 30 steps, the references of the killed ones."""
    runs = {n: workdir / f"run-straight-{n}" for n in (9, 30)}
    for n, out in runs.items():
        train(_cfg(small_capture, out, n), progress=False)
    return runs


def _assert_same_weights(run_a, run_b):
    a, b = _weights(run_a), _weights(run_b)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_run_killed_while_saving_resumes_and_equals_an_uninterrupted_one(small_capture, workdir, straight):
    resumed = workdir / "run-resumed"
    killed = _train_killed(_cfg(small_capture, resumed, 9), "2:checkpoint")  # half of the step-6 save
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert torch.load(resumed / "checkpoint.pt", weights_only=False)["step"] == 3  # the old one, whole
    train(_cfg(small_capture, resumed, 9), progress=False)
    logged = [json.loads(x) for x in (resumed / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged if "loss" in r] == [3, 6, 9], "resumed at 3; rows past it redone once"
    _assert_same_weights(straight[9], resumed)
    with pytest.raises(ValueError, match="mtp_steps"):
        train(TrainConfig(**{**vars(_cfg(small_capture, resumed, 12)), "mtp_steps": 2}), progress=False)


def test_kills_at_several_points_of_one_run_resume_to_the_uninterrupted_weights(small_capture, workdir, straight):
    """Killed in the first checkpoint save (nothing saved yet: the rerun starts afresh and drops
    the first attempt's log row), then in the log row of step 6 (the third write to the log: that
    drop, row 3, row 6), then run to the end."""
    run = workdir / "run-killed-twice"
    first = _train_killed(_cfg(small_capture, run, 9), "1:checkpoint")
    assert first.returncode == -signal.SIGKILL and not (run / "checkpoint.pt").exists(), first.stderr[-2000:]
    second = _train_killed(_cfg(small_capture, run, 9), "3:log")
    assert second.returncode == -signal.SIGKILL, second.stderr[-2000:]
    assert torch.load(run / "checkpoint.pt", weights_only=False)["step"] == 3
    train(_cfg(small_capture, run, 9), progress=False)
    logged = [json.loads(x) for x in (run / "log.jsonl").read_text().splitlines()]  # every line parses
    assert [r["step"] for r in logged if "loss" in r] == [3, 6, 9]
    _assert_same_weights(straight[9], run)


def test_kills_at_random_moments_of_the_loop_resume_to_the_uninterrupted_weights(small_capture, workdir, straight):
    """Real SIGKILLs at random moments once the loop is writing (after its n-th log row, n and
    the delay drawn at random), three times, then run to the end."""
    run, rnd = workdir / "run-killed-at-random", random.Random(11)
    log = run / "log.jsonl"
    for _ in range(3):
        proc = subprocess.Popen([sys.executable, "-c", TRAIN, json.dumps(asdict(_cfg(small_capture, run, 30)))],
                                env=_child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        rows, deadline = rnd.randrange(1, 6), time.time() + 300
        while proc.poll() is None and time.time() < deadline and \
                (not log.exists() or log.read_bytes().count(b"\n") < rows):
            time.sleep(0.005)
        time.sleep(rnd.uniform(0, 0.05))
        proc.kill()
        proc.wait()
    train(_cfg(small_capture, run, 30), progress=False)
    logged = [json.loads(x) for x in log.read_text().splitlines()]
    assert [r["step"] for r in logged if "loss" in r] == list(range(3, 31, 3))
    _assert_same_weights(straight[30], run)


def test_export_writes_a_loadable_plugin_draft(small_capture, workdir, straight):
    from vllm_sparrow.checkpoint import load_draft
    from vllm_sparrow.training.export import export_run

    run = straight[9]
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


def test_the_commands_say_what_happened_to_a_finished_a_changed_and_a_missing_run(small_capture, workdir,
                                                                                    straight, tmp_path):
    """Rerunning a finished `sparrow train` printed `loss nan, top-1 nan`; changed settings gave a
    traceback around the message; `export --run missing/` said to train longer. (The finished run
    is a copy in another folder: where a run lies is not one of its settings.)"""
    import shutil

    run = tmp_path / "finished"
    shutil.copytree(straight[9], run)
    argv = [sys.executable, "-m", "vllm_sparrow.cli", "train", "--capture", str(small_capture), "--out", str(run),
            "--steps", "9", "--lr", "0.003", "--mtp-steps", "1", "--visual-fraction", "0.5", "--window", "16",
            "--holdout", "1", "--save-every", "3", "--log-every", "3"]
    again = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"{run} has trained its 9 steps already" in again.stdout and "nan" not in again.stdout, again.stdout
    assert "rerun with a larger --steps" in again.stdout
    changed = subprocess.run(argv[:-2] + ["--log-every", "3", "--mtp-steps", "2"], capture_output=True, text=True,
                             timeout=600)
    assert changed.returncode == 2 and "other settings (mtp_steps: 1 there, 2 now)" in changed.stderr, changed.stderr[-3000:]
    assert "Traceback" not in changed.stderr
    baseline = subprocess.run(argv[:6] + ["--out", str(tmp_path / "eagle"), "--draft-kind", "eagle"],
                              capture_output=True, text=True, timeout=600)  # a plain capture has no EAGLE states
    assert baseline.returncode == 2 and "captured without --eagle-baseline" in baseline.stderr, baseline.stderr[-3000:]
    assert "Traceback" not in baseline.stderr and not (tmp_path / "eagle" / "checkpoint.pt").exists()
    missing = subprocess.run([sys.executable, "-m", "vllm_sparrow.cli", "export", "--run", str(tmp_path / "nowhere"),
                              "--out", str(tmp_path / "d")], capture_output=True, text=True, timeout=600)
    assert missing.returncode == 2 and "no such run directory" in missing.stderr, missing.stderr[-3000:]
    assert "Traceback" not in missing.stderr
