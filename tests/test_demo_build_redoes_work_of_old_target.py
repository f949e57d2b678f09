"""`sparrow demo build` resumes every stage, but captures and draft runs belong to one set of
target weights: when the target is retrained (or trained longer), the build must redo them, not
extend a capture of the old target or resume drafts trained on it."""

import torch
from safetensors.torch import save_file

from vllm_sparrow.demo.build import _forget_work_of_other_targets
from vllm_sparrow.training.capture import weights_fingerprint
from vllm_sparrow.training.shards import Manifest, save_manifest


def _weights(folder, value: float) -> None:
    folder.mkdir(exist_ok=True)
    save_file({"w": torch.full((4,), value)}, folder / "model.safetensors")


def _work(work, target) -> list:
    """A capture made by `target`'s current weights, and draft runs on it."""
    derived = [work / "capture", work / "train-sparrow", work / "train-no-ivsb"]
    for d in derived:
        d.mkdir(parents=True, exist_ok=True)
        (d / "state").write_text("from the first target")
    save_manifest(work / "capture", Manifest({"target": str(target), "target_weights": weights_fingerprint(target)}))
    return derived


def test_build_resumes_work_of_the_same_target_weights(tmp_path):
    target = tmp_path / "target"
    _weights(target, 1.0)
    derived = _work(tmp_path / "work", target)
    _forget_work_of_other_targets(tmp_path / "work", target)
    assert all((d / "state").exists() for d in derived)


def test_build_redoes_capture_and_drafts_when_target_weights_change(tmp_path):
    work, target = tmp_path / "work", tmp_path / "target"
    _weights(target, 1.0)
    derived = _work(work, target)
    (work / "clips").mkdir()  # clips do not depend on the target
    _weights(target, 2.0)  # the target trained on
    _forget_work_of_other_targets(work, target)
    assert not any(d.exists() for d in derived)
    assert (work / "clips").exists()


def test_build_redoes_draft_runs_left_without_their_capture(tmp_path):
    work, target = tmp_path / "work", tmp_path / "target"
    _weights(target, 1.0)
    (work / "train-sparrow").mkdir(parents=True)
    _forget_work_of_other_targets(work, target)
    assert not (work / "train-sparrow").exists()


def test_build_retrains_a_draft_whose_recipe_changed(small_capture, tmp_path):
    """A draft run made with another recipe (here IVSB dropout) is trained again, not refused."""
    import json

    from vllm_sparrow.demo.build import DemoBuildConfig, _train_draft

    cfg = DemoBuildConfig(draft_steps=2, holdout=1, window_tokens=16, mtp_steps=1, visual_drop=0.0)
    run, dest = tmp_path / "train-sparrow", tmp_path / "sparrow"
    _train_draft(cfg, "sparrow", small_capture, run, dest)
    cfg.visual_drop = 0.5
    _train_draft(cfg, "sparrow", small_capture, run, dest)
    assert json.loads((run / "train_config.json").read_text())["visual_drop"] == 0.5
    assert (dest / "config.json").exists()
