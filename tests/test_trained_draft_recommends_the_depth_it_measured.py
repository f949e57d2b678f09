"""One depth rule everywhere: the plugin, `sparrow caption` and the bench draft the draft's
recommended depth unless told, and `sparrow train` records that depth from what it measured: its
final held-out replay runs at the deepest served depth and the depth with the most tokens per
unit of step cost goes into the exported config.json (vllm_sparrow/training/depth.py); `--k`
sets it instead; `sparrow export` of the run writes the same depth."""

import json
import subprocess
import sys

import pytest

from vllm_sparrow.config import MAX_SPECULATIVE_TOKENS, SparrowConfig
from vllm_sparrow.training.acceptance import AcceptanceEstimate
from vllm_sparrow.training.depth import choose_depth
from vllm_sparrow.training.train import TrainConfig, train


def test_depth_is_the_best_rate_of_tokens_per_step_cost():
    est = AcceptanceEstimate(drafts=100, accepted=250, per_position=[90, 80, 50, 20])  # the module's example
    choice = choose_depth(est, 0.1, 0.1)
    assert choice.depth == 3
    assert [round(t, 2) for t in choice.tokens_per_step] == [1.9, 2.7, 3.2, 3.4]
    assert [round(s, 2) for s in choice.speed] == [1.58, 1.93, 2.0, 1.89]


def test_a_costly_verifier_buys_a_shorter_depth_and_a_free_one_the_longest():
    est = AcceptanceEstimate(drafts=100, accepted=480, per_position=[95, 90, 85, 80, 70, 60])
    assert choose_depth(est, 0.0, 0.0).depth == 6
    assert choose_depth(est, 0.05, 0.05).depth == 6
    assert choose_depth(est, 0.5, 0.5).depth == 1
    depths = [choose_depth(est, c, c).depth for c in (0.0, 0.1, 0.2, 0.4, 0.8)]
    assert depths == sorted(depths, reverse=True) and depths[0] > depths[-1]
    flat = AcceptanceEstimate(drafts=10, accepted=10, per_position=[10, 0, 0])  # nothing past position 1
    assert choose_depth(flat, 0.0, 0.0).depth == 1  # equal rates: the shallowest
    with pytest.raises(ValueError, match="no held-out sample"):
        choose_depth(AcceptanceEstimate(0, 0, [0] * 3), 0.1, 0.1)


def _cfg(capture, out, **kw):
    return TrainConfig(capture=str(capture), out=str(out), steps=6, lr=3e-3, mtp_steps=1, window_tokens=16,
                       holdout=1, save_every=3, log_every=3, **kw)


def test_training_without_k_records_the_depth_its_replay_measured(small_capture, tmp_path):
    result = train(_cfg(small_capture, tmp_path / "run"), progress=False)
    assert len(result.acceptance.per_position) == MAX_SPECULATIVE_TOKENS and result.acceptance.drafts > 0
    expected = choose_depth(result.acceptance, 0.1, 0.1)
    assert result.depth == expected
    assert SparrowConfig.load(result.draft_dir).speculative_tokens == expected.depth
    logged = [json.loads(x) for x in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert logged[-1]["recommended_depth"] == expected.depth
    # costlier steps on another machine: the finished run, rerun with them, trains nothing more
    # and records a depth no deeper from the same replay (here 1)
    costly = train(_cfg(small_capture, tmp_path / "run", draft_step_cost=5.0), progress=False)
    assert costly.already_done and costly.acceptance == result.acceptance
    assert SparrowConfig.load(costly.draft_dir).speculative_tokens == 1
    # export of the run's checkpoint writes the depth the run recorded last
    out = subprocess.run([sys.executable, "-m", "vllm_sparrow.cli", "export", "--run", str(tmp_path / "run"),
                          "--out", str(tmp_path / "exported")], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert SparrowConfig.load(tmp_path / "exported").speculative_tokens == 1


def test_k_sets_the_depth_and_the_replay(small_capture, tmp_path):
    result = train(_cfg(small_capture, tmp_path / "run", speculative_tokens=5), progress=False)
    assert len(result.acceptance.per_position) == 5 and result.depth is None
    assert SparrowConfig.load(result.draft_dir).speculative_tokens == 5


def test_the_train_command_names_the_depth_it_wrote(small_capture, tmp_path):
    argv = [sys.executable, "-m", "vllm_sparrow.cli", "train", "--capture", str(small_capture), "--out",
            str(tmp_path / "run"), "--steps", "3", "--mtp-steps", "1", "--window", "16", "--holdout", "1"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    depth = SparrowConfig.load(tmp_path / "run" / "draft").speculative_tokens
    assert f"recommended depth {depth} " in done.stdout and "config.json" in done.stdout, done.stdout
    assert f"(K={MAX_SPECULATIVE_TOKENS}, bonus included)" in done.stdout
