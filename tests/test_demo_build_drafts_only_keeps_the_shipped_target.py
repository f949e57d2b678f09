"""`sparrow demo build --drafts-only` retrains the drafts around the target already in --models:
a fresh checkout ships the target but not its training state, and without this the build
trained a new target (65 minutes for the hard world) before a draft experiment could start."""

import json

import pytest

from sparrow_world.demo import build as build_mod
from sparrow_world.demo.build import hard_world


def _never_train(*args, **kwargs):
    raise AssertionError("the target was trained")


def test_drafts_only_keeps_the_target_and_its_recorded_time(tmp_path, monkeypatch):
    monkeypatch.setattr(build_mod, "train_target", _never_train)
    out = tmp_path / "models"
    (out / "target").mkdir(parents=True)
    (out / "target" / "config.json").write_text("{}")
    (out / "build.json").write_text(json.dumps({"seconds": {"target (training wall clock)": 3901.2}}))
    cfg = hard_world(out=str(out), work=str(tmp_path / "work"), drafts_only=True)
    assert build_mod._target(cfg, out, tmp_path / "work") == (out / "target", 3901.2)


def test_drafts_only_without_a_target_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setattr(build_mod, "train_target", _never_train)
    cfg = hard_world(out=str(tmp_path / "models"), work=str(tmp_path / "work"), drafts_only=True)
    with pytest.raises(SystemExit, match="build without --drafts-only"):
        build_mod._target(cfg, tmp_path / "models", tmp_path / "work")


def test_the_cli_passes_drafts_only_to_the_build(monkeypatch, tmp_path):
    from vllm_sparrow.cli import build_parser

    for name in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_KVCACHE_SPACE"):  # `sparrow demo` sets defaults
        monkeypatch.delenv(name, raising=False)  # restored after the test
    seen = {}

    def build(cfg):  # what the build would be asked to do, no training
        seen["cfg"] = cfg
        return {}

    monkeypatch.setattr(build_mod, "build", build)
    args = build_parser().parse_args(["demo", "build", "--drafts-only", "--models", str(tmp_path / "m"),
                                      "--workdir", str(tmp_path / "w")])
    assert args.fn(args) == 0
    assert seen["cfg"].drafts_only and seen["cfg"].world == "hard" and seen["cfg"].out == str(tmp_path / "m")
