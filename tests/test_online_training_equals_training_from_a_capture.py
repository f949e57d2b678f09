"""`sparrow train --online --target T --data D` computes the target's states inside the training
loop and stores none: the same samples train to the same losses and weights as training from a
float32 capture of them (responses the target writes included), it resumes like any run, and
it refuses to start without its target and data."""

import json

import pytest
import torch

from vllm_sparrow.training.capture import CaptureConfig, capture
from vllm_sparrow.training.train import TrainConfig, TrainingRefused, train
from support.clip_data import dataset

KIND = "qwen2_5_vl"
STEPS = dict(steps=10, lr=3e-3, mtp_steps=1, holdout=1, log_every=1, save_every=5, speculative_tokens=3,
             window_tokens=64)


@pytest.fixture(scope="module")
def data(workdir, small_clips, target_dirs):
    rows = [{"video": f"v{i}.mp4", "prompt": f"describe clip {i}"} for i in range(3)]  # the target answers
    rows.insert(1, {"video": "v0.mp4", "prompt": "what moves?", "response": "a red square moves left"})
    rows.append({"prompt": "describe the red square moving left", "response_ids": [40, 41, 42, 43, 44]})
    jsonl = dataset(workdir / "online", small_clips, rows)
    return dict(root=jsonl.parent, target=str(target_dirs(KIND)), data=str(jsonl))


def _losses(run):
    return [r["loss"] for r in map(json.loads, (run / "log.jsonl").read_text().splitlines()) if "loss" in r]


def _weights(run):
    return torch.load(run / "checkpoint.pt", weights_only=False)["draft"]


@pytest.fixture(scope="module")
def runs(data):
    root = data["root"]
    capture(CaptureConfig(target=data["target"], data=data["data"], out=str(root / "cap"), num_frames=4,
                          max_new_tokens=8, store_dtype="float32"), progress=False)
    offline = train(TrainConfig(capture=str(root / "cap"), out=str(root / "offline"), **STEPS), progress=False)
    online_cfg = dict(online=True, target=data["target"], data=data["data"], num_frames=4, max_new_tokens=8, **STEPS)
    train(TrainConfig(out=str(root / "online-half"), **{**online_cfg, "steps": 5}), progress=False)
    resumed = train(TrainConfig(out=str(root / "online-half"), **online_cfg), progress=False)
    online = train(TrainConfig(out=str(root / "online"), **online_cfg), progress=False)
    return root, offline, online, resumed


def test_online_training_has_the_losses_and_weights_of_training_from_a_float32_capture(runs):
    root, offline, online, _ = runs
    assert len(_losses(root / "online")) == STEPS["steps"]
    assert _losses(root / "online") == pytest.approx(_losses(root / "offline"), rel=1e-6, abs=1e-7)
    for name, w in _weights(root / "offline").items():
        torch.testing.assert_close(_weights(root / "online")[name], w, rtol=1e-5, atol=1e-6)
    assert online.acceptance.mean_acceptance_length == pytest.approx(offline.acceptance.mean_acceptance_length)
    assert not list((root / "online").glob("*.safetensors")) and not (root / "online" / "manifest.json").exists()


def test_an_online_run_resumes_where_it_stopped(runs):
    root, _, _, resumed = runs
    assert resumed.steps == STEPS["steps"]
    for name, w in _weights(root / "online").items():
        assert torch.equal(_weights(root / "online-half")[name], w), name


def test_online_needs_a_target_and_data_and_no_capture(data, tmp_path):
    with pytest.raises(TrainingRefused, match="give both, and no --capture"):
        train(TrainConfig(online=True, target=data["target"], out=str(tmp_path / "a"), **STEPS), progress=False)
    with pytest.raises(TrainingRefused, match="--online --target T --data D"):
        train(TrainConfig(out=str(tmp_path / "b"), **STEPS), progress=False)
