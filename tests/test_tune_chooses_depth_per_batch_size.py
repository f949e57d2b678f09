"""`sparrow tune`: the depth per batch size comes from the draft's held-out replay and the step
costs vLLM measures; a costly verifier buys a shorter depth, a free one the longest; the plugin
serves the written schedule, losslessly."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

from vllm import SamplingParams

from conftest import DEMO_MODELS as DEMO, close_llm, make_llm
from sparrow_world.tiny_targets import make_prompt
from vllm_sparrow.engine_stats import spec_counters
from vllm_sparrow.training.acceptance import AcceptanceEstimate
from vllm_sparrow.training.depth import depth_schedule
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
    schedule = depth_schedule(est, per_token)
    depth = {lo: d for lo, _, d in schedule}
    assert schedule[0][:2] == [1, 3] and depth[1] == 8, schedule  # free: the longest the replay measured
    assert 1 < depth[4] < 8 and depth[16] == 1, schedule  # dearer tokens, shorter drafts
    assert schedule[-1][1] == 16  # vLLM carries the last depth on to larger batches


def test_noisy_timings_never_make_drafted_tokens_free_of_charge():
    noisy = StepCost(1, {1: 0.011, 8: 0.010})  # depth 8 timed faster than depth 1
    assert noisy.per_token == 0.0 and noisy.line()[0] > 0


def _capture_two_clips(tmp_path):
    from vllm_sparrow.training.capture import CaptureConfig, capture

    videos = DEMO_MODELS.parent.parent / "examples" / "videos"
    rows = [{"video": str(videos / "world_32s.mp4"), "prompt": "describe the video ."}] * 2
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    capture(CaptureConfig(target=str(DEMO_MODELS / "target"), data=str(tmp_path / "data.jsonl"),
                          out=str(tmp_path / "cap"), num_frames=64, max_new_tokens=160, store_dtype="float32"),
            progress=False)
    return tmp_path / "cap"


def test_tune_measures_steps_in_vllm_writes_the_schedule_and_the_plugin_serves_it(tmp_path):
    cap = _capture_two_clips(tmp_path)
    draft = tmp_path / "draft"
    shutil.copytree(DEMO_MODELS / "sparrow", draft)
    out = tmp_path / "tune.json"
    done = subprocess.run(
        [sys.executable, "-m", "vllm_sparrow.cli", "tune", "--draft", str(draft), "--capture", str(cap),
         "--samples", "2", "--batch-sizes", "1,3", "--steps", "5", "--frames", "64", "--out", str(out), "--write",
         "--engine-args", json.dumps({"max_model_len": 1536})],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    tokens = result["tokens_per_step"]
    assert len(tokens) == 8 and tokens == sorted(tokens) and tokens[-1] > 3, tokens  # the trained draft accepts
    for row in result["costs"]:  # both depths timed at both batch sizes, in vLLM
        assert set(row["ms_per_step"]) == {"1", "8"} and all(ms > 0 for ms in row["ms_per_step"].values()), row
    replay = result["replay"]
    est = AcceptanceEstimate(replay["drafts"], sum(replay["per_position"]), replay["per_position"])
    expected = depth_schedule(est, {r["batch"]: r["per_token_cost"] for r in result["costs"]})
    assert result["schedule"] == expected, (result, expected)  # the measured costs made the choice
    assert "num_speculative_tokens_per_batch_size" in done.stdout
    written = json.loads((draft / "config.json").read_text())
    assert written["depth_per_batch_size"] == result["schedule"]
    assert written["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == result["schedule"][0][2]

    # served as written (the user gives no depth), and lossless at batch 1 and 3
    schedule = [[1, 2, 8], [3, 16, 2]]  # one with two depths, so the test sees the switch
    written["depth_per_batch_size"] = schedule
    (draft / "config.json").write_text(json.dumps(written))
    target = str(DEMO_MODELS / "target")
    prompts = [make_prompt("qwen2_5_vl", target, f"describe the blue circle {i}", None) for i in range(3)]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    base = make_llm(target, max_model_len=1024)
    reference = [list(o.outputs[0].token_ids) for o in base.generate(prompts, params, use_tqdm=False)]
    close_llm(base)
    llm = make_llm(target, max_model_len=1024, disable_log_stats=False,
                   speculative_config={"method": "sparrow", "model": str(draft)})
    spec = llm.llm_engine.vllm_config.speculative_config
    assert [list(e) for e in spec.num_speculative_tokens_per_batch_size] == schedule
    assert spec.num_speculative_tokens == 8
    depth = {}
    for batch in (1, 3):
        before = spec_counters(llm)
        outs = [list(o.outputs[0].token_ids) for o in llm.generate(prompts[:batch], params, use_tqdm=False)]
        after = spec_counters(llm)
        assert outs == reference[:batch]
        depth[batch] = (after["num_draft_tokens"] - before["num_draft_tokens"]) / (after["num_drafts"] - before["num_drafts"])
    close_llm(llm)
    assert depth[1] > 6 and depth[3] <= 2.0, depth
