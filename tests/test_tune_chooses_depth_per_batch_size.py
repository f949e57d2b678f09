"""`sparrow tune`: the depth per batch size comes from the draft's held-out replay and the step
costs vLLM measures, the draft's share and the verifier's apart; a costly verifier buys a shorter
depth, a free one the longest; where drafting is dear and verifying cheap a tree would pay, and
the reverse keeps the chain; the plugin serves the written schedule unless the user gives a depth."""

import json
import os
import shutil
import statistics

import pytest
import subprocess
import sys
from pathlib import Path

from conftest import DEMO_MODELS as DEMO
from vllm_sparrow.training.acceptance import AcceptanceEstimate
from vllm_sparrow.training.depth import depth_schedule, tree_verdict
from vllm_sparrow.training.step_cost import StepCost

DEMO_MODELS = Path(DEMO)


# a replay at K = 8 keeping ~0.8 of the drafts at each next position (real captioners' range)
REPLAY = AcceptanceEstimate(drafts=100, accepted=383, per_position=[85, 68, 55, 45, 38, 32, 27, 23])


def test_a_costly_verifier_buys_a_shorter_depth_and_a_free_one_the_longest():
    est = REPLAY
    free = StepCost(1, {1: 0.010, 8: 0.010})  # drafting and verifying 8 costs what 1 does
    cheap = StepCost(4, {1: 0.012, 8: 0.024})  # a drafted token costs 1/6 of the step's fixed part
    costly = StepCost(16, {1: 0.030, 8: 0.170})  # a drafted token costs twice the fixed part
    per_token = {c.batch: c.per_token for c in (free, cheap, costly)}
    assert per_token[1] == 0.0 and 0.0 < per_token[4] < per_token[16]
    schedule = depth_schedule(est, {b: (0.0, cost) for b, cost in per_token.items()})
    depth = {lo: d for lo, _, d in schedule}
    assert schedule[0][:2] == [1, 3] and depth[1] == 8, schedule  # free: the longest the replay measured
    assert 1 < depth[4] < 8 and depth[16] == 1, schedule  # dearer tokens, shorter drafts
    assert schedule[-1][1] == 16  # vLLM carries the last depth on to larger batches


def test_the_drafters_own_time_splits_a_token_into_its_draft_and_verify_shares():
    cost = StepCost(1, {1: 0.012, 8: 0.026}, draft_seconds={1: 0.002, 8: 0.009})  # 2 ms a token, 1 of it drafting
    fixed, per_token = cost.line()
    assert fixed == pytest.approx(0.010) and per_token == pytest.approx(0.002)
    assert cost.draft_token == pytest.approx(0.1) and cost.verify_token == pytest.approx(0.1)
    assert cost.per_token == pytest.approx(0.2)
    assert StepCost(1, {1: 0.01, 8: 0.02}).draft_token == 0.0  # drafter not timed: all of it counted as verifying


def test_a_tree_pays_where_drafting_is_dear_and_verifying_cheap_and_not_the_reverse():
    """The chain's depth sees only d + v, but a tree verifies N nodes after D draft forwards: with
    the same sum, a cheap verifier and a costly draft choose the tree, the reverse the chain."""
    chains = {k: t for k, t in enumerate([1.85, 2.53, 3.08, 3.53, 3.91, 4.23, 4.50, 4.73], 1)}
    trees = {16: (5.9, 8), 32: (6.5, 8)}  # a search of depth 8 verifying its 16 / 32 best nodes
    cheap_verify = tree_verdict(chains, trees, d=0.25, v=0.01)
    costly_verify = tree_verdict(chains, trees, d=0.01, v=0.25)
    assert cheap_verify.best.startswith("tree") and costly_verify.best.startswith("chain"), (cheap_verify, costly_verify)
    # the chain alone cannot tell the two machines apart (d + v = 0.26 on both)
    assert depth_schedule(REPLAY, {1: (0.25, 0.01)}) == depth_schedule(REPLAY, {1: (0.01, 0.25)})
    # break-even: at this d a tree wins below its v and loses above it
    for n, v_star in cheap_verify.break_even_v.items():
        assert v_star is not None and 0.01 < v_star < 0.25
        above = tree_verdict(chains, {n: trees[n]}, d=0.25, v=v_star * 1.05)
        below = tree_verdict(chains, {n: trees[n]}, d=0.25, v=v_star * 0.95)
        assert above.best.startswith("chain") and below.best == f"tree {n}"


def test_noisy_timings_never_make_drafted_tokens_free_of_charge():
    noisy = StepCost(1, {1: 0.011, 8: 0.010})  # depth 8 timed faster than depth 1
    assert noisy.per_token == 0.0 and noisy.line()[0] > 0


def test_the_cost_line_fits_every_timed_depth_and_says_how_far_it_misses():
    linear = StepCost(1, {1: 0.011, 8: 0.018, 16: 0.026})  # 1 ms a token on 10 ms fixed, exactly
    fixed, per_token = linear.line()
    assert fixed == pytest.approx(0.010) and per_token == pytest.approx(0.001) and linear.line_miss < 1e-9
    # a cost that bends up past depth 8: a line through depths 1 and 16 alone would have priced
    # depth 8 at 0.0155 s, 29% over its timing, and said nothing; the fit through all three says
    # how far a line misses
    bent = StepCost(1, {1: 0.011, 8: 0.012, 16: 0.026})
    fit = statistics.linear_regression(list(bent.seconds), list(bent.seconds.values()))
    assert bent.line() == pytest.approx((fit.intercept, fit.slope))
    fixed, per_token = bent.line()
    misses = [abs(fixed + k * per_token - t) / t for k, t in bent.seconds.items()]
    assert bent.line_miss == pytest.approx(max(misses)) and bent.line_miss > 0.2


def test_tune_times_evenly_spaced_depths_from_one_to_the_deepest():
    from vllm_sparrow.training.tune import cost_depths

    assert cost_depths(16, 3) == (1, 8, 16) and cost_depths(16, 2) == (1, 16) and cost_depths(16, 4) == (1, 6, 11, 16)
    with pytest.raises(ValueError, match="two depths"):
        cost_depths(16, 1)


def test_tune_gives_cpu_engines_a_fixed_kv_cache_unless_the_user_set_one(monkeypatch):
    from vllm_sparrow import envs

    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    with envs.cpu_kv_cache_unless_set(4):
        assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "4"
    assert "VLLM_CPU_KVCACHE_SPACE" not in os.environ  # only while tune's engines open
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "9")
    with envs.cpu_kv_cache_unless_set(4):
        assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "9"  # the user's wins


def test_tune_times_steps_at_the_captures_frames_unless_told(tmp_path, monkeypatch):
    """A verified token's cost grows with the context: tune's requests carry the capture's frames
    (the replay's context), or --frames where the user serves another."""
    import vllm_sparrow.training.data as data_module
    from vllm_sparrow.training.tune import TuneConfig, _requests

    video = DEMO_MODELS.parent.parent / "examples" / "videos" / "world_32s.mp4"
    (tmp_path / "data.jsonl").write_text(json.dumps({"video": str(video), "prompt": "describe the video ."}) + "\n")
    seen = []
    monkeypatch.setattr(data_module, "load_media", lambda sample, frames: seen.append(frames) or "frames")
    settings = {"target": str(DEMO_MODELS / "target"), "data": str(tmp_path / "data.jsonl"), "num_frames": 40}
    _requests(TuneConfig(draft="d", capture="c", samples=1), settings)
    _requests(TuneConfig(draft="d", capture="c", samples=1, num_frames=8), settings)
    assert seen == [40, 8]


def test_a_video_too_long_for_the_engines_budget_gets_an_error_saying_what_to_pass(monkeypatch):
    import vllm_sparrow.training.step_cost as step_cost
    import vllm_sparrow.training.tune as tune_module

    def refused(*args, **kwargs):  # what vLLM raises when add_request meets a video over its budget
        raise RuntimeError("The decoder prompt contains a(n) video item with 6144 embedding tokens, which exceeds "
                           "the pre-allocated encoder cache size 4096.")

    monkeypatch.setattr(tune_module, "_capture_settings", lambda capture: {"target": "t"})
    monkeypatch.setattr(tune_module, "_requests", lambda cfg, settings: ([], None))
    monkeypatch.setattr(step_cost, "measure_step_costs", refused)
    with pytest.raises(ValueError, match="max_num_batched_tokens.*fewer --frames"):
        tune_module.tune(tune_module.TuneConfig(draft="d", capture="c"), progress=lambda *_: None)


def _capture_two_clips(tmp_path):
    from vllm_sparrow.training.capture import CaptureConfig, capture

    videos = DEMO_MODELS.parent.parent / "examples" / "videos"
    rows = [{"video": str(videos / "world_32s.mp4"), "prompt": "describe the video ."}] * 2
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    capture(CaptureConfig(target=str(DEMO_MODELS / "target"), data=str(tmp_path / "data.jsonl"),
                          out=str(tmp_path / "cap"), num_frames=64, max_new_tokens=160, store_dtype="float32"),
            progress=False)
    return tmp_path / "cap"


def test_tune_measures_steps_in_vllm_and_writes_the_schedule_its_costs_choose(tmp_path):
    cap = _capture_two_clips(tmp_path)
    draft = tmp_path / "draft"
    shutil.copytree(DEMO_MODELS / "sparrow", draft)
    out = tmp_path / "tune.json"
    done = subprocess.run(
        [sys.executable, "-m", "vllm_sparrow.cli", "tune", "--draft", str(draft), "--capture", str(cap),
         "--samples", "2", "--batch-sizes", "1,3", "--steps", "9", "--cost-points", "2", "--out", str(out), "--write",
         "--engine-args", json.dumps({"max_model_len": 1536})],
        capture_output=True, text=True, timeout=600,
        # as a user runs it: vLLM's engine core in its own process unless tune keeps it in (it must,
        # to time engine.step(); with the suite's in-process setting passed down, a tune that left
        # the core outside returned 0.0 ms steps and failed reading the drafter's timer), and with
        # no CPU KV cache size given (tune sets one: vLLM's free-memory default refused a second engine)
        env={k: v for k, v in os.environ.items() if k not in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_KVCACHE_SPACE")})
    print(done.stdout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    tokens = result["tokens_per_step"]
    assert len(tokens) == 16 and tokens == sorted(tokens) and tokens[-1] > 3, tokens  # the trained draft accepts
    # two depths timed at both batch sizes, in vLLM, in two engine starts each (the line through
    # more depths, and how far it misses: test_the_cost_line_fits_every_timed_depth_and_says_how_far_it_misses)
    for row in result["costs"]:
        assert set(row["ms_per_step"]) == {"1", "16"} and all(ms > 0 for ms in row["ms_per_step"].values()), row
        assert all(len(ms) == 2 and row["ms_per_step"][k] == min(ms) for k, ms in row["ms_per_step_rounds"].items())
        assert row["line_miss"] >= 0 and "misses a timed depth by" in done.stdout
    starts = [line.split(", batch")[0] for line in done.stdout.splitlines() if ", batch 1:" in line]
    assert starts == [f"round {r}, depth {d}" for r, ds in ((1, (1, 16)), (2, (16, 1))) for d in ds], starts
    replay = result["replay"]
    est = AcceptanceEstimate(replay["drafts"], sum(replay["per_position"]), replay["per_position"])
    for row in result["costs"]:  # the drafter's own share, timed inside the same steps
        assert set(row["draft_ms_per_step"]) == {"1", "16"} and 0 < row["draft_ms_per_step"]["1"] < row["ms_per_step"]["1"]
        assert row["draft_token_cost"] + row["verify_token_cost"] == pytest.approx(row["per_token_cost"], abs=2e-4)
    expected = depth_schedule(est, {r["batch"]: (r["draft_token_cost"], r["verify_token_cost"])
                                    for r in result["costs"]})
    assert result["schedule"] == expected, (result, expected)  # the measured costs made the choice
    trees = result["trees"]
    assert trees["points"] > 0 and set(trees["tau"]) == {"8", "16", "32"}
    assert set(trees["verdicts"]) == {"1", "3"} and "tree verification" in done.stdout
    # beside this machine's choice, what the same replay picks on the reference GPU's costs
    from vllm_sparrow.training import gpu_costs

    assert result["reference"]["schedule"] == depth_schedule(est, gpu_costs.COSTS)
    assert "on the reference GPU" in done.stdout and set(result["reference"]["trees"]) == {"1", "8", "32"}
    assert "num_speculative_tokens_per_batch_size" in done.stdout
    written = json.loads((draft / "config.json").read_text())
    assert written["depth_per_batch_size"] == result["schedule"]
    assert written["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == result["schedule"][0][2]
    # the stop threshold: calibrated at the batch-1 depth with batch 1's measured token cost
    batch1 = next(r["per_token_cost"] for r in result["costs"] if r["batch"] == 1)
    stop, scores = _calibrated_stop(draft, cap, result["schedule"][0][2], batch1)
    assert result["stop_confidence"] == stop and written.get("stop_confidence") == stop, (result, scores)
    assert f"stop_confidence: {stop}" in done.stdout


def _calibrated_stop(draft, cap, k, verify_token_cost):
    from vllm_sparrow.checkpoint import load_draft
    from vllm_sparrow.training.acceptance import calibrate_stop_confidence
    from vllm_sparrow.training.shards import ShardReader
    from vllm_sparrow.training.target_runner import HFTarget

    return calibrate_stop_confidence(load_draft(draft), HFTarget(str(DEMO_MODELS / "target")),
                                     list(ShardReader(cap)), k, verify_token_cost)



def test_the_plugin_serves_the_drafts_schedule_unless_the_user_gives_a_depth(tmp_path):
    """The draft's depth_per_batch_size becomes vLLM's num_speculative_tokens_per_batch_size (served
    losslessly as vLLM's own schedule: test_deep_drafts_are_lossless); the user's depth wins."""
    from vllm.engine.arg_utils import EngineArgs

    draft = tmp_path / "draft"
    shutil.copytree(DEMO_MODELS / "sparrow", draft)
    config = json.loads((draft / "config.json").read_text())
    config["depth_per_batch_size"] = [[1, 2, 8], [3, 16, 2]]
    (draft / "config.json").write_text(json.dumps(config))

    def spec(**kw):
        args = EngineArgs(model=str(DEMO_MODELS / "target"), max_model_len=1024,
                          speculative_config={"method": "sparrow", "model": str(draft), **kw})
        return args.create_engine_config().speculative_config

    served = spec()
    assert [list(e) for e in served.num_speculative_tokens_per_batch_size] == [[1, 2, 8], [3, 16, 2]]
    assert served.num_speculative_tokens == 8
    own = spec(num_speculative_tokens=4)
    assert own.num_speculative_tokens == 4 and own.num_speculative_tokens_per_batch_size is None
    theirs = spec(num_speculative_tokens=5, num_speculative_tokens_per_batch_size=[[1, 8, 5], [9, 64, 1]])
    assert [list(e) for e in theirs.num_speculative_tokens_per_batch_size] == [[1, 8, 5], [9, 64, 1]]
