"""`sparrow demo build` resumes every stage, but captures and draft runs belong to one capture
recipe (the target's weights, the capture settings, the clips' data file): when the target is
retrained, the capture asked for differently or the clips changed, the build must redo them, not
extend a capture of the old recipe, refuse it, or resume drafts trained on it."""

import dataclasses

import torch
from safetensors.torch import save_file

from sparrow_world.demo.build import _forget_stale_work
from vllm_sparrow.training.capture import CaptureConfig
from vllm_sparrow.training.shards import Manifest, data_lines_digest, save_manifest


def _weights(folder, value: float) -> None:
    folder.mkdir(exist_ok=True)
    save_file({"w": torch.full((4,), value)}, folder / "model.safetensors")


def _recipe(tmp_path, value: float = 1.0) -> CaptureConfig:
    target, data = tmp_path / "target", tmp_path / "data.jsonl"
    _weights(target, value)
    if not data.exists():
        data.write_text('{"video": "a.mp4"}\n{"video": "b.mp4"}\n')
    return CaptureConfig(target=str(target), data=str(data), out=str(tmp_path / "work" / "capture"),
                         max_seq_len=16384, engine=True)


def _work(work, recipe: CaptureConfig) -> list:
    """A capture made by `recipe` (settings as capture records them, ivsb_layer resolved), and draft runs on it."""
    derived = [work / "capture", work / "train-sparrow", work / "train-no-ivsb"]
    for d in derived:
        d.mkdir(parents=True, exist_ok=True)
        (d / "state").write_text("from the first recipe")
    lines, sha = data_lines_digest(recipe.data)
    save_manifest(work / "capture", Manifest({**recipe.settings(), "ivsb_layer": 4},
                                             data={"lines": lines, "sha256": sha}))
    return derived


def test_build_resumes_work_of_the_same_recipe(tmp_path):
    recipe = _recipe(tmp_path)
    derived = _work(tmp_path / "work", recipe)
    _forget_stale_work(tmp_path / "work", recipe)
    assert all((d / "state").exists() for d in derived)


def test_build_resumes_a_capture_whose_data_file_grew(tmp_path):
    recipe = _recipe(tmp_path)
    derived = _work(tmp_path / "work", recipe)
    with open(recipe.data, "a") as f:
        f.write('{"video": "c.mp4"}\n')  # samples are indexed by line: appending is resumable
    _forget_stale_work(tmp_path / "work", recipe)
    assert all((d / "state").exists() for d in derived)


def test_build_redoes_capture_and_drafts_when_target_weights_change(tmp_path):
    work = tmp_path / "work"
    derived = _work(work, _recipe(tmp_path))
    (work / "clips").mkdir()  # clips do not depend on the target
    _forget_stale_work(work, _recipe(tmp_path, 2.0))  # the target trained on
    assert not any(d.exists() for d in derived)
    assert (work / "clips").exists()


def test_build_redoes_capture_and_drafts_when_capture_settings_change(tmp_path, capsys):
    work, recipe = tmp_path / "work", _recipe(tmp_path)
    derived = _work(work, recipe)
    _forget_stale_work(work, dataclasses.replace(recipe, max_seq_len=28672))  # longer clips
    assert not any(d.exists() for d in derived)
    assert "max_seq_len" in capsys.readouterr().out


def test_build_redoes_capture_and_drafts_when_clips_change(tmp_path):
    work, recipe = tmp_path / "work", _recipe(tmp_path)
    derived = _work(work, recipe)
    with open(recipe.data, "w") as f:  # a long clip listed first: every line moves
        f.write('{"video": "long.mp4"}\n{"video": "a.mp4"}\n{"video": "b.mp4"}\n')
    _forget_stale_work(work, recipe)
    assert not any(d.exists() for d in derived)


def test_build_redoes_draft_runs_left_without_their_capture(tmp_path):
    work = tmp_path / "work"
    (work / "train-sparrow").mkdir(parents=True)
    _forget_stale_work(work, _recipe(tmp_path))
    assert not (work / "train-sparrow").exists()


def test_build_retrains_a_draft_whose_recipe_changed(small_capture, tmp_path):
    """A draft run made with another recipe (here IVSB dropout) is trained again, not refused."""
    import json

    from sparrow_world.demo.build import DemoBuildConfig, _train_draft

    cfg = DemoBuildConfig(draft_steps=2, holdout=1, window_tokens=16, mtp_steps=1, visual_drop=0.0)
    run, dest = tmp_path / "train-sparrow", tmp_path / "sparrow"
    _train_draft(cfg, "sparrow", small_capture, run, dest)
    cfg.visual_drop = 0.5
    _train_draft(cfg, "sparrow", small_capture, run, dest)
    assert json.loads((run / "train_config.json").read_text())["visual_drop"] == 0.5
    assert (dest / "config.json").exists()


def test_target_training_starts_over_when_its_recipe_changed(tmp_path, monkeypatch, capsys):
    """A finished target run is only re-saved when resumed with its own recipe (or with knobs that
    do not change weights, like threads); with another recipe it trains from scratch instead of
    continuing weights made for the old one."""
    import dataclasses
    import json

    from sparrow_world.demo import train_target as tt

    monkeypatch.setattr(tt, "LONG_EVAL_SCENES", 0)  # keep the evals tiny
    cfg = tt.TargetTrainConfig(minutes=0.05, extension=tt.Extension(minutes=0.05), eval_scenes=1)
    out, state = tmp_path / "target", tmp_path / "state"

    def evals():
        return [json.loads(x)["step"] for x in (state / "train_log.jsonl").read_text().splitlines()]

    tt.train_target(out, cfg, resume=True, state_dir=state)
    first = evals()
    tt.train_target(out, dataclasses.replace(cfg, threads=1), resume=True, state_dir=state)
    assert evals() == first and "resumed at step" in capsys.readouterr().out  # finished: nothing redone
    tt.train_target(out, dataclasses.replace(cfg, vision_aux_weight=0.0), resume=True, state_dir=state)
    said = capsys.readouterr().out
    assert "another recipe (vision_aux_weight)" in said and "resumed" not in said
    assert evals().count(0) == 1  # a fresh log, not the old one appended to
    assert torch.load(state / "train_state.pt", weights_only=False)["config"]["vision_aux_weight"] == 0.0
