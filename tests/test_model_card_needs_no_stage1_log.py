"""`sparrow demo card` on a checkout that ships the target but not its training log: the card's
stage-1 figures (last eval's step, minutes, vision heads) come from build.json, which the build
now records them in. Before, the card read <workdir>/target/train_log.jsonl and failed without
it, so the hard world's card could not be rewritten after its long stage (a later session)."""

import json
from dataclasses import asdict

import pytest

from sparrow_world.demo import build as build_mod
from sparrow_world.demo import model_card
from sparrow_world.demo.build import STAGE1_RECORD, hard_world

SUMMARY = {"step": 3900, "minutes": 65.02, "vision": {"colour": 0.97, "shape": 0.89, "size": 0.95, "motion": 0.88}}


def _eval_row(step: int, minutes: float, colour: float) -> dict:
    return {"step": step, "minutes": minutes, "stage": "extension", "acc": {"all": 0.8},
            "vision": {"colour": colour, "shape": 0.5}}


@pytest.fixture
def models(tmp_path, monkeypatch):
    """A models folder with the build record and sparrow config the card reads; the weights'
    sizes and the measured accuracy (a target run) faked."""
    monkeypatch.setattr(model_card, "_params", lambda folder: 1_000_000)
    monkeypatch.setattr(model_card, "target_accuracy", lambda target, world: {
        name: {"colour": 0.9, "all": 0.8} for name in ("acc", "acc_stretch100", "acc_long", "acc_blank")})
    out = tmp_path / "models"
    (out / "sparrow").mkdir(parents=True)
    (out / "sparrow" / "config.json").write_text(json.dumps(
        {"speculators_config": {"proposal_methods": [{"speculative_tokens": 8}]}}))
    record = {"config": asdict(hard_world()), "seconds": {"target (training wall clock)": 3901.2, "capture": 139.9},
              STAGE1_RECORD: SUMMARY, "capture": "kept 220 samples",
              **{f"{k}_heldout_replay": {"mean_acceptance_length": v}
                 for k, v in (("sparrow", 5.84), ("eagle", 5.83), ("eagle3", 4.71))}}
    (out / "build.json").write_text(json.dumps(record, indent=1))
    return out


def test_the_card_takes_stage_1_from_build_json_when_the_log_is_absent(models, tmp_path):
    card = model_card.write_card(models, tmp_path / "work", None).read_text()
    assert "Trained for 3900 steps (65 min wall clock)" in card
    assert "colour 0.97, shape 0.89, size 0.95, motion 0.88." in card
    assert "- Then a long stage of 400 batch-1 steps" in card
    assert "Sparrow 5.84, EAGLE baseline 5.83, EAGLE-3 baseline 4.71." in card


def test_the_log_wins_over_build_json_when_it_is_there(models, tmp_path):
    from vllm_sparrow.durable import append_jsonl

    work = tmp_path / "work"
    (work / "target").mkdir(parents=True)
    for row in (_eval_row(3000, 50.0, 0.5), _eval_row(4100, 66.6, 0.99), {"step": 4100, "note": "not an eval"}):
        append_jsonl(work / "target" / "train_log.jsonl", row)
    card = model_card.write_card(models, work, None).read_text()
    assert "Trained for 4100 steps (67 min wall clock)" in card and "colour 0.99, shape 0.50." in card


def test_without_either_the_card_says_what_is_missing(models, tmp_path):
    record = json.loads((models / "build.json").read_text())
    del record[STAGE1_RECORD]
    (models / "build.json").write_text(json.dumps(record))
    with pytest.raises(SystemExit, match=f"train_log.jsonl is missing and .*build.json has no '{STAGE1_RECORD}'"):
        model_card.write_card(models, tmp_path / "work", None)


def _target_only_build(tmp_path, monkeypatch) -> dict:
    """`build` up to the target (train_target faked): build.json as it writes it."""
    monkeypatch.setattr(build_mod, "train_target", lambda out, cfg, **kw: out)
    monkeypatch.setattr(build_mod, "long_stage_record", lambda state_dir: None)
    (tmp_path / "models").mkdir(exist_ok=True)
    build_mod.build(hard_world(out=str(tmp_path / "models"), work=str(tmp_path / "work"), stages="target"))
    return json.loads((tmp_path / "models" / "build.json").read_text())


def test_the_build_records_stage_1_from_its_log(tmp_path, monkeypatch):
    from vllm_sparrow.durable import append_jsonl

    (tmp_path / "work" / "target").mkdir(parents=True)
    for row in (_eval_row(3000, 50.0, 0.5), _eval_row(3900, 65.02, 0.97)):
        append_jsonl(tmp_path / "work" / "target" / "train_log.jsonl", row)
    assert _target_only_build(tmp_path, monkeypatch)[STAGE1_RECORD] == {
        "step": 3900, "minutes": 65.02, "vision": {"colour": 0.97, "shape": 0.5}}


def test_a_build_without_the_log_keeps_the_record_that_made_the_target(tmp_path):
    """A long stage started from the shipped target (or a drafts-only build): no stage-1 log in
    the workdir, so the record of the build before goes into the new build.json (which a full
    build writes whole, not merged), as its training seconds do."""
    out = tmp_path / "models"
    out.mkdir()
    (out / "build.json").write_text(json.dumps({"seconds": {"target (training wall clock)": 3901.2},
                                                STAGE1_RECORD: SUMMARY}))
    record = {"config": {}, "seconds": {}}
    build_mod._record_stage1(record, out, tmp_path / "work" / "target")
    assert record[STAGE1_RECORD] == SUMMARY
