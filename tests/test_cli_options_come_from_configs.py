"""Every `sparrow` option is generated from its config dataclass (knobs.py): each field is an
option with the field's default, and parsing a bare command gives back the config's defaults."""

import dataclasses

import pytest

from vllm_sparrow import cli
from vllm_sparrow.batch_caption import CaptionJob
from vllm_sparrow.knobs import from_args
from vllm_sparrow.config import SparrowConfig
from vllm_sparrow.training.acceptance import StopCalibration
from vllm_sparrow.training.capture import CaptureConfig
from vllm_sparrow.training.export import ExportJob
from vllm_sparrow.training.probe_layers import ProbeJob
from vllm_sparrow.training.train import TrainConfig

REQUIRED = {"train": ["--capture", "c", "--out", "o"], "capture": ["--target", "t", "--data", "d", "--out", "o"],
            "caption": ["--inputs", "i", "--out", "o", "--target", "t"], "export": ["--run", "r", "--out", "o"],
            "probe-layers": ["--target", "t", "--data", "d"], "calibrate-stop": ["--draft", "d", "--capture", "c"]}


def _parse(argv):
    return cli.build_parser().parse_args(argv)


@pytest.mark.parametrize("command,cls", [("train", TrainConfig), ("capture", CaptureConfig), ("caption", CaptionJob),
                                         ("export", ExportJob), ("probe-layers", ProbeJob),
                                         ("calibrate-stop", StopCalibration)])
def test_a_bare_command_parses_to_the_configs_defaults(command, cls):
    args = _parse([command, *REQUIRED[command]])
    cfg = from_args(cls, args)
    required = dict(zip(REQUIRED[command][::2], REQUIRED[command][1::2]))
    expected = cls(**{f.name: required[f"--{f.name}"] for f in dataclasses.fields(cls) if f"--{f.name}" in required})
    assert cfg == expected


def test_flags_map_to_fields_and_parse_their_values():
    args = _parse(["train", *REQUIRED["train"], "--anchors", "2", "--window", "none", "--k", "5", "--no-ivsb",
                   "--draft-kind", "eagle3"])
    cfg = from_args(TrainConfig, args)
    assert (cfg.anchor_tokens, cfg.window_tokens, cfg.speculative_tokens, cfg.ivsb, cfg.draft_kind) == \
        (2, None, 5, False, "eagle3")
    args = _parse(["caption", *REQUIRED["caption"], "--engine-args", '{"max_model_len": 64}', "--k", "4"])
    assert from_args(CaptionJob, args).engine_args == {"max_model_len": 64}
    assert from_args(CaptionJob, args).num_speculative_tokens == 4


def test_draft_defaults_have_one_source():
    train, job = TrainConfig(capture="c", out="o"), CaptionJob(inputs="i", out="o", target="t")
    sparrow = SparrowConfig(hidden_size=8, num_attention_heads=2, num_key_value_heads=1, head_dim=4,
                            intermediate_size=8, vocab_size=8)
    assert (train.anchor_tokens, train.window_tokens) == (sparrow.anchor_tokens, sparrow.window_tokens)
    assert train.speculative_tokens is None  # training records the depth its replay measured (depth.py)
    assert job.num_speculative_tokens is None  # caption drafts at the draft's recommended depth, as vLLM serves it
    args = _parse(["init-draft", "--target", "t", "--out", "o"])
    assert (args.anchor_tokens, args.window_tokens, args.speculative_tokens) == \
        (sparrow.anchor_tokens, sparrow.window_tokens, sparrow.speculative_tokens)


def test_every_option_and_choice_of_every_command_has_help():
    """`sparrow X --help` had empty entries (init-draft --seed, demo --max-tokens and its actions)."""
    import argparse

    parser = cli.build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert {"init-draft", "capture", "train", "export", "caption", "demo", "bench"} <= set(commands.choices)
    empty = [f"{name} {'/'.join(a.option_strings) or a.dest}" for name, sub in commands.choices.items()
             for a in sub._actions if not isinstance(a, argparse._HelpAction) and not (a.help or "").strip()]
    assert not empty, empty


def test_a_draft_config_json_round_trips_and_absent_fields_take_the_dataclass_defaults():
    """from_json_dict restated every default (4 anchors, window 512, eps, RoPE base...): a changed
    default would have split in two. Now a field the file lacks is the dataclass's."""
    import dataclasses

    import pytest

    from vllm_sparrow.config import DraftConfigError

    shipped = SparrowConfig.load("models/world/sparrow")
    assert SparrowConfig.from_json_dict(shipped.to_json_dict()) == shipped
    sparse = shipped.to_json_dict()
    for key in ("anchor_tokens", "window_tokens", "has_own_lm_head"):
        del sparse[key]
    del sparse["transformer_layer_config"]["rope_theta"]
    loaded = SparrowConfig.from_json_dict(sparse)
    defaults = {f.name: f.default for f in dataclasses.fields(SparrowConfig)}
    for name in ("anchor_tokens", "window_tokens", "has_own_lm_head", "rope_theta"):
        assert getattr(loaded, name) == defaults[name], name
    del sparse["transformer_layer_config"]["vocab_size"]
    with pytest.raises(DraftConfigError, match="vocab_size"):
        SparrowConfig.from_json_dict(sparse)
