"""The EAGLE-style baseline (attends over every position, visual ones included) trains on the
same captures and is served by vLLM's built-in `eagle` method: lossless, and vLLM measures the
acceptance the training replay predicts (so the baseline sees in training exactly what vLLM
feeds it: placeholder embeddings, final states of all positions, M-RoPE's temporal row)."""

import json

import pytest
from conftest import close_llm, make_llm
from vllm import SamplingParams

from support.engine_probe import spec_counters

KIND = "qwen2_5_vl"
PROMPTS = ["describe the video", "what moves first", "name the colours", "count the shapes"]
MAX_NEW, K = 24, 3


def _record_draft_positions(worker):
    """Keep the rotary positions of every call of vLLM's EAGLE draft model (first call: prefill)."""
    model = worker.model_runner.drafter.model
    model.seen_positions = []
    forward = model.forward

    def recording(input_ids, positions, *args, **kwargs):
        model.seen_positions.append(positions.clone().cpu())
        return forward(input_ids, positions, *args, **kwargs)

    model.forward = recording


def _draft_positions(worker):
    return worker.model_runner.drafter.model.seen_positions


@pytest.fixture(scope="module")
def baseline(workdir, target_dirs):
    from vllm_sparrow.training.acceptance import estimate_acceptance_full_stream
    from vllm_sparrow.training.capture import CaptureConfig, capture
    from vllm_sparrow.training.eagle_baseline import EagleBaselineDraft
    from vllm_sparrow.training.shards import ShardReader
    from vllm_sparrow.training.target_runner import HFTarget
    from vllm_sparrow.training.train import TrainConfig, train
    from sparrow_world.synthetic_clip import write_synthetic_clip

    root, target = workdir / "eagle-baseline", target_dirs(KIND)
    root.mkdir()
    rows = []
    for j, text in enumerate(PROMPTS):
        write_synthetic_clip(root / f"v{j}.mp4", 8, width=112, height=112, seed=50 + j)
        rows.append({"video": f"v{j}.mp4", "prompt": text})
    rows += [{"prompt": "a held-out question"}, {"prompt": "another one"}]
    (root / "data.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    capture(CaptureConfig(target=str(target), data=str(root / "data.jsonl"), out=str(root / "cap"),
                          num_frames=8, max_new_tokens=MAX_NEW, eagle_baseline=True), progress=False)
    result = train(TrainConfig(capture=str(root / "cap"), out=str(root / "run"), draft_kind="eagle",
                               steps=150, lr=3e-3, mtp_steps=2, holdout=2, speculative_tokens=K), progress=False)
    hf, reader = HFTarget(str(target)), ShardReader(root / "cap")
    seen = [reader[i] for i in range(len(PROMPTS))]
    simulated = estimate_acceptance_full_stream(EagleBaselineDraft.load(result.draft_dir), hf, seen, K)
    return dict(root=root, target=target, rows=rows, result=result, hf=hf, simulated=simulated, seen=seen)


def test_baseline_is_lossless_in_vllm_eagle_and_accepts_as_simulated(baseline):
    from vllm_sparrow.video import decode_video

    hf, root = baseline["hf"], baseline["root"]
    reqs = [{"prompt": hf.chat_prompt(r["prompt"], "video"),
             "multi_modal_data": {"video": decode_video(root / r["video"], num_frames=8)}}
            for r in baseline["rows"][: len(PROMPTS)]]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW)
    base = make_llm(baseline["target"])
    reference = [list(o.outputs[0].token_ids) for o in base.generate(reqs, params)]
    close_llm(base)
    llm = make_llm(baseline["target"], disable_log_stats=False, max_num_seqs=1, speculative_config={
        "method": "eagle", "model": str(baseline["result"].draft_dir), "num_speculative_tokens": K})
    llm.collective_rpc(_record_draft_positions)
    outputs = [list(o.outputs[0].token_ids) for o in llm.generate(reqs[:1], params)]
    outputs += [list(o.outputs[0].token_ids) for o in llm.generate(reqs[1:], params)]
    c, seen = spec_counters(llm), llm.collective_rpc(_draft_positions)[0]
    close_llm(llm)
    # vLLM's prefill call of the draft sees the positions the baseline was trained with
    first = baseline["seen"][0]
    prompt_len = int(first["prompt_len"])
    assert seen[0][:prompt_len].tolist() == first["positions"][:prompt_len].tolist()
    assert first["positions"][prompt_len - 1] < prompt_len - 1, "M-RoPE compresses the video's span"
    assert outputs == reference
    measured = 1 + c["num_accepted_tokens"] / c["num_drafts"]
    simulated = baseline["simulated"].mean_acceptance_length
    assert simulated > 2.0, "the in-sample replay must show a trained baseline"
    assert abs(measured - simulated) < 0.25, (measured, simulated)
