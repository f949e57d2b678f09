"""capture -> train (IVSB + MTP) -> export -> vLLM: the trained draft loads, stays lossless, and
vLLM measures the acceptance the training's replay predicted; captured hidden states are the
ones vLLM hands the proposer.

The tiny random target has no structure that carries over to unseen prompts (its greedy text is
chaotic), so acceptance is measured on samples the draft was trained on; the generalisation
test lives with the learnable demo world.
"""

import json

import pytest
import torch
from support.clip_data import clip_rows
from conftest import close_llm, make_llm
from vllm import SamplingParams

from support.engine_probe import drafter_inputs, record_drafter_inputs, spec_counters

KIND = "qwen2_5_vl"
PROMPTS = ["describe the video", "what moves first", "name the colours you see", "count the shapes"]
MAX_NEW = 32
K = 3


@pytest.fixture(scope="module")
def pipeline(workdir, target_dirs):
    from vllm_sparrow.checkpoint import init_draft, load_draft
    from vllm_sparrow.training.acceptance import estimate_acceptance
    from vllm_sparrow.training.capture import CaptureConfig, capture
    from vllm_sparrow.training.shards import ShardReader
    from vllm_sparrow.training.target_runner import HFTarget
    from vllm_sparrow.training.train import TrainConfig, train

    root, target = workdir / "pipeline", target_dirs(KIND)
    root.mkdir()
    rows = clip_rows(root, PROMPTS)
    rows += [{"prompt": "describe the red square moving left"}, {"prompt": "a blue circle"}]
    (root / "data.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    report = capture(CaptureConfig(target=str(target), data=str(root / "data.jsonl"), out=str(root / "cap"),
                                   num_frames=4, max_new_tokens=MAX_NEW, shard_size=4, store_dtype="float32"),
                     progress=False)  # float32: the states are compared with vLLM's at 2e-3
    assert report.kept == len(rows)
    result = train(TrainConfig(capture=str(root / "cap"), out=str(root / "run"), steps=150, lr=3e-3,
                               mtp_steps=2, window_tokens=64, holdout=2, log_every=10, speculative_tokens=K),
                   progress=False)
    hf = HFTarget(str(target))
    reader = ShardReader(root / "cap")
    seen = [reader[i] for i in range(4)]  # trained-on samples: video 0 of each prompt
    init_draft(target, root / "untrained", window_tokens=64)
    return dict(root=root, target=target, rows=rows, result=result, hf=hf, seen=seen,
                trained=estimate_acceptance(load_draft(result.draft_dir), hf, seen, K),
                untrained=estimate_acceptance(load_draft(root / "untrained"), hf, seen, K),
                log=[json.loads(x) for x in (root / "run" / "log.jsonl").read_text().splitlines()])


def test_training_lowers_the_loss_and_lifts_simulated_acceptance(pipeline):
    losses = [row["loss"] for row in pipeline["log"] if "loss" in row]
    assert losses[-1] < 0.5 * losses[0], losses
    assert pipeline["result"].top1 > 0.8
    trained, untrained = pipeline["trained"], pipeline["untrained"]
    assert untrained.mean_acceptance_length < 1.3
    assert trained.mean_acceptance_length > untrained.mean_acceptance_length + 1.5, (trained, untrained)
    # MTP: the deeper draft positions are accepted too
    assert trained.per_position[K - 1] > 0.5 * trained.per_position[0]


@pytest.fixture(scope="module")
def served(pipeline, clips):
    from vllm_sparrow.video import decode_video

    hf, root = pipeline["hf"], pipeline["root"]
    reqs = [{"prompt": hf.chat_prompt(r["prompt"], "video"),
             "multi_modal_data": {"video": decode_video(root / r["video"], num_frames=4)}}
            for r in pipeline["rows"][:4]]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW)
    base = make_llm(pipeline["target"])
    reference = [list(o.outputs[0].token_ids) for o in base.generate(reqs, params)]
    close_llm(base)
    llm = make_llm(pipeline["target"], disable_log_stats=False, max_num_seqs=1, speculative_config={
        "method": "sparrow", "model": str(pipeline["result"].draft_dir), "num_speculative_tokens": K})
    record_drafter_inputs(llm)
    outputs = [list(o.outputs[0].token_ids) for o in llm.generate(reqs, params)]
    counters, recorded = spec_counters(llm), drafter_inputs(llm)
    close_llm(llm)
    return dict(reference=reference, outputs=outputs, counters=counters, recorded=recorded)


def test_exported_draft_is_lossless_in_vllm_and_accepts_as_simulated(pipeline, served):
    assert served["outputs"] == served["reference"]
    # the target in vLLM writes exactly the responses capture stored (same model, same prompt)
    for out, sample in zip(served["outputs"], pipeline["seen"]):
        assert out == sample["token_ids"][int(sample["prompt_len"]):].tolist()
    c = served["counters"]
    measured = 1 + c["num_accepted_tokens"] / c["num_drafts"]
    simulated = pipeline["trained"].mean_acceptance_length
    # the replay stops at the last full K-draft; vLLM also drafts past it at each request's end
    assert abs(measured - simulated) < 0.25, (measured, simulated)


def test_captured_hidden_states_are_what_vllm_hands_the_proposer(pipeline, served):
    # max_num_seqs=1: each request's prefill arrives alone as one step
    prefills = [b for b in served["recorded"] if b["seq_start"] == [0]]
    assert len(prefills) == len(pipeline["seen"])
    for batch, sample in zip(prefills, pipeline["seen"]):
        prompt_len = int(sample["prompt_len"])
        text = ~sample["is_visual"][:prompt_len]
        assert torch.equal(batch["token_ids"], sample["token_ids"][:prompt_len])
        vllm_text_states = batch["hidden"][text]  # [prompt text tokens, H]
        captured = sample["text_hidden"][: int(text.sum())].float()
        torch.testing.assert_close(vllm_text_states, captured, atol=2e-3, rtol=2e-3)
