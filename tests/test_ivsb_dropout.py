"""IVSB dropout (`visual_drop`): a share of the training samples get no visual states, so the
draft also trains the text-only path it serves with."""

import torch

from vllm_sparrow.training.train import TrainConfig, train


def _cfg(capture, out, **kw):
    return TrainConfig(capture=str(capture), out=str(out), steps=3, lr=3e-3, mtp_steps=1, visual_fraction=0.5,
                       window_tokens=16, holdout=1, save_every=3, log_every=3, **kw)


def _weights(run):
    return torch.load(run / "checkpoint.pt", weights_only=False)["draft"]


def test_ivsb_dropout_trains_some_samples_without_visual_states(small_capture, workdir):
    """visual_drop = 1 drops every sample's visual states: exactly the run without IVSB; with IVSB
    on every sample the weights differ (so the visual states do reach training)."""
    runs = {name: workdir / f"run-{name}" for name in ("drop-all", "no-ivsb", "ivsb")}
    train(_cfg(small_capture, runs["drop-all"], visual_drop=1.0), progress=False)
    train(_cfg(small_capture, runs["no-ivsb"], ivsb=False), progress=False)
    train(_cfg(small_capture, runs["ivsb"]), progress=False)
    dropped, without, with_ivsb = (_weights(runs[n]) for n in ("drop-all", "no-ivsb", "ivsb"))
    for key in dropped:
        assert torch.equal(dropped[key], without[key]), key
    assert any(not torch.equal(dropped[k], with_ivsb[k]) for k in dropped)
