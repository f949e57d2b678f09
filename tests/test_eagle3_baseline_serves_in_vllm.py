"""The EAGLE-3 baseline: `sparrow capture --eagle3` stores the auxiliary target states vLLM hands
an eagle3 draft (the same numbers, visual positions included); a draft exported by
`Eagle3Draft.save` loads in vLLM 0.32 under `method: "eagle3"` against a Qwen2.5-VL target with
every weight it expects and keeps outputs lossless; `sparrow train --draft-kind eagle3` trains
one whose acceptance in vLLM is what the training's replay predicts."""

import json

import pytest
import torch
from support.clip_data import clip_rows
from conftest import close_llm, make_llm
from vllm import SamplingParams

from support.engine_probe import spec_counters
from sparrow_world.tiny_targets import make_prompt

KIND, K = "qwen2_5_vl", 3
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def setup(workdir, target_dirs):
    from vllm_sparrow.training.capture import CaptureConfig, capture
    from vllm_sparrow.training.eagle3 import init_eagle3
    from vllm_sparrow.training.shards import ShardReader
    from sparrow_world.synthetic_clip import write_synthetic_clip

    target = target_dirs(KIND)
    root = workdir / "eagle3"
    root.mkdir()
    write_synthetic_clip(root / "v.mp4", 4, width=112, height=112, seed=3)
    rows = [{"video": "v.mp4", "prompt": "describe the video"}, {"prompt": "a blue circle moves"}]
    (root / "data.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    capture(CaptureConfig(target=str(target), data=str(root / "data.jsonl"), out=str(root / "cap"), num_frames=4,
                          max_new_tokens=GREEDY.max_tokens, eagle3=True, store_dtype="float32"),
            progress=False)  # float32: the states are compared with vLLM's at 2e-3
    draft = init_eagle3(target, draft_vocab=list(range(0, 400, 2)))  # a reduced vocabulary: d2t exported
    draft_dir = draft.save(root / "draft")
    return dict(target=target, draft=draft, draft_dir=draft_dir, reader=ShardReader(root / "cap"), root=root)


def _install(worker):
    drafter = worker.model_runner.drafter
    drafter.seen = []
    inner = drafter.propose

    def propose(*args, **kwargs):
        hidden = kwargs.get("target_hidden_states", args[3] if len(args) > 3 else None)
        drafter.seen.append(hidden.float().cpu().clone())
        return inner(*args, **kwargs)

    drafter.propose = propose


def _seen(worker):
    return worker.model_runner.drafter.seen


@pytest.fixture(scope="module")
def served(setup):
    from vllm_sparrow.video import decode_video

    target = setup["target"]
    video = {"prompt": make_prompt(KIND, target, "describe the video", "video"),
             "multi_modal_data": {"video": decode_video(setup["root"] / "v.mp4", num_frames=4)}}
    reqs = [video, {"prompt": make_prompt(KIND, target, "a blue circle moves", None)}]
    base = make_llm(target)
    reference = [list(o.outputs[0].token_ids) for o in base.generate(reqs, GREEDY, use_tqdm=False)]
    close_llm(base)
    llm = make_llm(target, speculative_config={"method": "eagle3", "model": str(setup["draft_dir"]),
                                               "num_speculative_tokens": K})
    llm.collective_rpc(_install)
    first = llm.generate(reqs[:1], GREEDY, use_tqdm=False)  # alone: its prefill is the first propose()
    seen = llm.collective_rpc(_seen)[0]
    rest = llm.generate(reqs[1:], GREEDY, use_tqdm=False)
    close_llm(llm)
    return dict(reference=reference, outputs=[list(o.outputs[0].token_ids) for o in first + rest], seen=seen)


def test_exported_eagle3_draft_loads_with_every_weight_and_stays_lossless(setup, served):
    from safetensors.torch import load_file

    assert served["outputs"] == served["reference"]
    names = set(load_file(str(setup["draft_dir"] / "model.safetensors")))
    expected = {"fc.weight", "norm.weight", "lm_head.weight", "d2t"} | {
        f"midlayer.{n}.weight" for n in ("hidden_norm", "input_layernorm", "post_attention_layernorm",
                                         "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                         "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}
    assert names == expected  # vLLM would leave a missing one uninitialised without a word


def test_captured_auxiliary_states_are_what_vllm_hands_the_eagle3_draft(setup, served):
    sample = setup["reader"][0]  # the video sample
    prefill = served["seen"][0]  # [prompt tokens, A * H]: the video request's prefill
    n = prefill.shape[0]
    assert int(sample["prompt_len"]) == n and bool(sample["is_visual"][:n].any())
    assert sample["aux_layers"].tolist() == list(setup["draft"].cfg.aux_layer_ids)
    torch.testing.assert_close(prefill, sample["aux_hidden"][:n].float(), atol=2e-3, rtol=1e-3)


def test_eagle3_draft_reloads_as_exported(setup):
    from vllm_sparrow.training.eagle3 import Eagle3Draft

    again = Eagle3Draft.load(setup["draft_dir"])
    for key, value in setup["draft"].state_dict().items():
        assert torch.equal(again.state_dict()[key], value), key
    assert again.cfg == setup["draft"].cfg


PROMPTS = ["describe the video", "what moves first", "name the colours you see", "count the shapes"]


@pytest.fixture(scope="module")
def trained(workdir, target_dirs):
    """An EAGLE-3 draft trained by `sparrow train --draft-kind eagle3` on a small capture."""
    from types import SimpleNamespace

    from vllm_sparrow.training.capture import CaptureConfig, capture
    from vllm_sparrow.training.eagle3 import Eagle3Draft
    from vllm_sparrow.training.recipes import recipe_for
    from vllm_sparrow.training.shards import ShardReader
    from vllm_sparrow.training.target_runner import HFTarget
    from vllm_sparrow.training.train import TrainConfig, train

    root, target = workdir / "eagle3-train", target_dirs(KIND)
    root.mkdir()
    rows = clip_rows(root, PROMPTS)
    (root / "data.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    capture(CaptureConfig(target=str(target), data=str(root / "data.jsonl"), out=str(root / "cap"), num_frames=4,
                          max_new_tokens=32, eagle_baseline=True, eagle3=True), progress=False)
    result = train(TrainConfig(capture=str(root / "cap"), out=str(root / "run"), draft_kind="eagle3", steps=150,
                               lr=3e-3, mtp_steps=2, holdout=2, log_every=10, speculative_tokens=K), progress=False)
    reader = ShardReader(root / "cap")
    seen = [reader[i] for i in range(4)]  # trained-on samples (the tiny random target does not generalise)
    cfg = SimpleNamespace(speculative_tokens=K)
    replay = recipe_for("eagle3").validate(cfg, Eagle3Draft.load(result.draft_dir), HFTarget(str(target)), seen)
    return dict(root=root, rows=rows, target=target, result=result, seen=seen, replay=replay)


def test_trained_eagle3_draft_is_lossless_in_vllm_and_accepts_as_replayed(trained):
    from vllm_sparrow.video import decode_video

    target = trained["target"]
    reqs = [{"prompt": make_prompt(KIND, target, r["prompt"], "video"),
             "multi_modal_data": {"video": decode_video(trained["root"] / r["video"], num_frames=4)}}
            for r in trained["rows"][:4]]
    params = SamplingParams(temperature=0.0, max_tokens=32)
    llm = make_llm(target, disable_log_stats=False, max_num_seqs=1, speculative_config={
        "method": "eagle3", "model": str(trained["result"].draft_dir), "num_speculative_tokens": K})
    outputs = [list(o.outputs[0].token_ids) for o in llm.generate(reqs, params, use_tqdm=False)]
    c = spec_counters(llm)
    close_llm(llm)
    for out, sample in zip(outputs, trained["seen"]):  # the target's own greedy answers, unchanged
        assert out == sample["token_ids"][int(sample["prompt_len"]):].tolist()
    measured = 1 + c["num_accepted_tokens"] / c["num_drafts"]
    replayed = trained["replay"].mean_acceptance_length
    print(f"eagle3: vLLM {measured:.2f}, replay {replayed:.2f}")
    assert replayed > 2.0, trained["replay"]  # training took
    assert abs(measured - replayed) < 0.25, (measured, replayed)
