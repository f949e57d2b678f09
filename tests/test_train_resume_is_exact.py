"""`sparrow train` is seeded and resumable: a run stopped and resumed ends with exactly the
weights of an uninterrupted run; a resume with other settings is refused; export writes the
plugin draft from the checkpoint."""

import json

import pytest
import torch

from vllm_sparrow.training.train import TrainConfig, train


def _cfg(capture, out, steps, **kw):
    return TrainConfig(capture=str(capture), out=str(out), steps=steps, lr=3e-3, mtp_steps=1,
                       visual_fraction=0.5, window_tokens=16, holdout=1, save_every=3, log_every=3, **kw)


def _weights(run):
    return torch.load(run / "checkpoint.pt", weights_only=False)["draft"]


def test_stopped_and_resumed_run_equals_an_uninterrupted_one(small_capture, workdir):
    straight, resumed = workdir / "run-straight", workdir / "run-resumed"
    train(_cfg(small_capture, straight, 9), progress=False)
    train(_cfg(small_capture, resumed, 6), progress=False)  # "stopped" after its step-6 checkpoint
    train(_cfg(small_capture, resumed, 9), progress=False)
    logged = [json.loads(x) for x in (resumed / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged if "loss" in r] == [3, 6, 9], "the second run must continue at 6"
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
