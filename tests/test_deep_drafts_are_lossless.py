"""Deep drafts, to the plugin's limit: the shipped Sparrow draft serves K = 16 speculative tokens
per step losslessly, on video and text prompts mixed in one batch, every draft it hands vLLM
(all 16 positions) equal to the training model's dense recomputation, and its deep positions
accepted; vLLM's per-batch-size schedule carries it."""

from conftest import DEMO_MODELS, close_llm, make_llm
from vllm import SamplingParams

from support.dense_reference import StreamReplay, check_engine_drafts, placeholder_ids
from support.engine_probe import drafter_inputs, record_drafter_inputs, spec_counters
from sparrow_world.tiny_targets import make_prompt

K = 16  # vllm_sparrow.config.MAX_SPECULATIVE_TOKENS


def test_sparrow_at_depth_16_is_lossless_drafts_like_the_dense_reference_and_accepts_deep_positions(tmp_path):
    from transformers import AutoTokenizer

    from sparrow_world.bench.clips import eval_clips
    from vllm_sparrow.checkpoint import load_draft
    from vllm_sparrow.config import MAX_SPECULATIVE_TOKENS
    from vllm_sparrow.training.target_runner import HFTarget
    from vllm_sparrow.video import decode_video

    assert MAX_SPECULATIVE_TOKENS == K
    target = f"{DEMO_MODELS}/target"
    clips = eval_clips(tmp_path / "clips", (512,), 2, 30_000_000)[512]
    prompt = make_prompt("qwen2_5_vl", target, "describe the video .", "video")
    reqs = [{"prompt": prompt, "multi_modal_data": {"video": decode_video(c.path)}} for c in clips]
    reqs.append({"prompt": make_prompt("qwen2_5_vl", target, "describe the red square", None)})
    params = SamplingParams(temperature=0.0, max_tokens=96)
    base = make_llm(target, max_model_len=2048)
    reference = [list(o.outputs[0].token_ids) for o in base.generate(reqs, params, use_tqdm=False)]
    close_llm(base)
    llm = make_llm(target, max_model_len=2048, disable_log_stats=False, speculative_config={
        "method": "sparrow", "model": f"{DEMO_MODELS}/sparrow", "num_speculative_tokens": K})
    record_drafter_inputs(llm)
    done = llm.generate(reqs, params, use_tqdm=False)
    outputs = [list(o.outputs[0].token_ids) for o in done]
    c, steps = spec_counters(llm), list(drafter_inputs(llm))
    close_llm(llm)
    assert outputs == reference
    replay = StreamReplay(placeholder_ids("qwen2_5_vl", AutoTokenizer.from_pretrained(target)),
                          {o.request_id: len(o.prompt_token_ids) for o in done})
    counts = check_engine_drafts(steps, replay, load_draft(f"{DEMO_MODELS}/sparrow"), HFTarget(target))
    assert counts["drafting"] > 10 and counts["tokens"] == K * counts["drafting"], counts
    per_pos = [n / c["num_drafts"] for n in c["per_pos"]]
    print("per-position acceptance at K = 16:", [round(x, 2) for x in per_pos])
    assert len(per_pos) == K and per_pos[7] > 0.5 and per_pos[K - 1] > 0.2, per_pos  # deep tokens land too


def test_depth_follows_vllms_per_batch_size_schedule():
    """vLLM's num_speculative_tokens_per_batch_size (the best K falls with the batch): one request
    drafts 16 tokens a step, a batch of 8 drafts 3, and both stay lossless."""
    target = f"{DEMO_MODELS}/target"
    prompts = [make_prompt("qwen2_5_vl", target, f"describe the red square {i}", None) for i in range(8)]
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    base = make_llm(target, max_model_len=1024)
    reference = [list(o.outputs[0].token_ids) for o in base.generate(prompts, params, use_tqdm=False)]
    close_llm(base)
    llm = make_llm(target, max_model_len=1024, disable_log_stats=False, speculative_config={
        "method": "sparrow", "model": f"{DEMO_MODELS}/sparrow", "num_speculative_tokens": K,
        "num_speculative_tokens_per_batch_size": [[1, 2, 16], [3, 16, 3]]})
    depth = {}
    for batch in (1, 8):
        before = spec_counters(llm)
        outs = [list(o.outputs[0].token_ids) for o in llm.generate(prompts[:batch], params, use_tqdm=False)]
        after = spec_counters(llm)
        assert outs == reference[:batch]
        drafts = after["num_drafts"] - before["num_drafts"]
        depth[batch] = (after["num_draft_tokens"] - before["num_draft_tokens"]) / drafts
    close_llm(llm)
    print("draft tokens per step by batch size:", depth)
    assert depth[1] > 12 and depth[8] <= 3.0, depth  # (the last steps of a request may draft fewer)


def test_adaptive_length_verifies_fewer_tokens_and_stays_lossless(monkeypatch, tmp_path):
    """SPARROW_STOP_CONFIDENCE: a request's chain stops where its cumulative draft confidence
    falls below the threshold; vLLM verifies only the drafts kept and the output is unchanged,
    for video and text requests prefilled and decoded in one batch."""
    from sparrow_world.bench.clips import eval_clips
    from vllm_sparrow.video import decode_video

    target = f"{DEMO_MODELS}/target"
    clips = eval_clips(tmp_path / "clips", (512,), 2, 30_000_000)[512]
    video = make_prompt("qwen2_5_vl", target, "describe the video .", "video")
    prompts = [make_prompt("qwen2_5_vl", target, f"describe the red square {i}", None) for i in range(4)]
    prompts[1:1] = [{"prompt": video, "multi_modal_data": {"video": decode_video(c.path)}} for c in clips]
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    base = make_llm(target, max_model_len=1024)
    reference = [list(o.outputs[0].token_ids) for o in base.generate(prompts, params, use_tqdm=False)]
    close_llm(base)
    runs = {}
    for threshold in ("off", "0.9"):
        monkeypatch.setenv("SPARROW_STOP_CONFIDENCE", threshold)
        llm = make_llm(target, max_model_len=1024, disable_log_stats=False, speculative_config={
            "method": "sparrow", "model": f"{DEMO_MODELS}/sparrow", "num_speculative_tokens": K})
        outs = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]
        runs[threshold] = (outs, spec_counters(llm))
        close_llm(llm)
    for threshold, (outs, _) in runs.items():
        assert outs == reference, threshold
    full, adaptive = runs["off"][1], runs["0.9"][1]
    per_draft = {t: c["num_draft_tokens"] / c["num_drafts"] for t, c in (("off", full), ("0.9", adaptive))}
    acc_rate = {t: c["num_accepted_tokens"] / c["num_draft_tokens"] for t, c in (("off", full), ("0.9", adaptive))}
    print("draft tokens verified per step:", per_draft, "accepted share:", acc_rate)
    assert per_draft["off"] > K - 0.5 and per_draft["0.9"] < per_draft["off"] - 1  # shorter proposals verified
    assert acc_rate["0.9"] > acc_rate["off"]  # and the ones dropped were the likely misses


def test_stop_confidence_is_calibrated_on_held_out_samples(small_capture, trained_drafts, target_dirs):
    """Free verification keeps every draft token; costly verification buys a threshold."""
    from vllm_sparrow.checkpoint import load_draft
    from vllm_sparrow.training.acceptance import calibrate_stop_confidence
    from vllm_sparrow.training.shards import ShardReader
    from vllm_sparrow.training.target_runner import HFTarget

    draft = load_draft(trained_drafts("qwen2_5_vl"))
    target = HFTarget(str(target_dirs("qwen2_5_vl")))
    samples = list(ShardReader(small_capture))
    free, scores_free = calibrate_stop_confidence(draft, target, samples, 6, verify_token_cost=0.0)
    costly, scores_costly = calibrate_stop_confidence(draft, target, samples, 6, verify_token_cost=2.0)
    assert free is None, scores_free  # nothing to save: draft all K
    assert costly is not None and scores_costly[costly] > scores_costly["off"], scores_costly
