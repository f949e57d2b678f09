"""Greedy outputs with sparrow equal outputs without speculation, token for token, on one batch
that mixes long and short videos, an image and text-only prompts; vLLM's spec-decode counters
agree with the outputs, and the draft cache does not grow with video length."""

import numpy as np
import pytest
from conftest import TRAINED_TEXTS, close_llm, make_llm
from vllm import SamplingParams

from engine_probe import (
    drafter_inputs,
    drafter_stats,
    record_drafter_inputs,
    spec_counters,
    text_entries_by_request,
)
from sparrow_world.tiny_targets import make_prompt

K = 3
MAX_TOKENS = 40
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
# (long, short) video frame counts per target; None: a text-only target.
FRAMES = {"qwen2_5_vl": (64, 4), "qwen2_vl": (64, 4), "qwen3_vl": (64, 4),
          "llava_onevision": (32, 4), "llama": None}
QUESTION = "describe the video"


def _requests(kind, target, clips):
    texts = [{"prompt": make_prompt(kind, target, t, None)} for t in TRAINED_TEXTS]
    if FRAMES[kind] is None:
        return texts
    long_f, short_f = FRAMES[kind]
    rng = np.random.default_rng(0)
    image = rng.integers(0, 255, (112, 112, 3), dtype=np.uint8)
    from PIL import Image

    reqs = [
        {"prompt": make_prompt(kind, target, QUESTION, "video"), "multi_modal_data": {"video": clips(long_f)}},
        {"prompt": make_prompt(kind, target, QUESTION, "video"), "multi_modal_data": {"video": clips(short_f)}},
        {"prompt": make_prompt(kind, target, "what is in the picture", "image"),
         "multi_modal_data": {"image": Image.fromarray(image)}},
    ]
    return reqs + texts


@pytest.fixture(scope="module", params=sorted(FRAMES))
def case(request, target_dirs, trained_drafts, clips):
    kind = request.param
    target, draft = target_dirs(kind), trained_drafts(kind)
    reqs = _requests(kind, target, clips)
    base = make_llm(target)  # the plain engine first: upstream needs that order in one process
    reference = [list(o.outputs[0].token_ids) for o in base.generate(reqs, GREEDY)]
    close_llm(base)
    tree = _deep_tree_adaptive_outputs(target, draft, reqs)
    llm = make_llm(target, disable_log_stats=False,
                   speculative_config={"method": "sparrow", "model": str(draft), "num_speculative_tokens": K})
    record_drafter_inputs(llm)
    outputs = llm.generate(reqs, GREEDY)
    yield kind, reference, outputs, llm, tree
    close_llm(llm)


DEEP_K = 6  # the deeper-drafts engine: depth 6, tree search, adaptive length, all at once


def _deep_tree_adaptive_outputs(target, draft, reqs):
    """The same batch drafted DEEP_K deep by tree search (top-3 expansion, best path), each
    request's chain cut where its draft confidence falls below 0.5 (adaptive length)."""
    import os

    env = {"SPARROW_TREE_TOPK": "3", "SPARROW_STOP_CONFIDENCE": "0.5"}  # read at load, in process
    os.environ.update(env)
    try:
        llm = make_llm(target, disable_log_stats=False, speculative_config={
            "method": "sparrow", "model": str(draft), "num_speculative_tokens": DEEP_K})
    finally:
        for key in env:
            del os.environ[key]
    outputs = [list(o.outputs[0].token_ids) for o in llm.generate(reqs, GREEDY)]
    tree, counters = drafter_stats(llm)["tree"], spec_counters(llm)
    close_llm(llm)
    return tree, counters, outputs


def test_deep_tree_search_with_adaptive_length_equals_target_outputs(case):
    kind, reference, _, _, (tree, counters, outputs) = case
    assert tree == [3, 3 * (DEEP_K - 1)], "the engine must have drafted by tree search"
    per_step = counters["num_draft_tokens"] / counters["num_drafts"]
    assert 1 <= per_step < DEEP_K, f"{kind}: adaptive length must cut some chains ({per_step:.2f} per step)"
    for i, (ref, out) in enumerate(zip(reference, outputs)):
        assert out == ref, f"{kind}: request {i} differs with deep drafts, tree search and adaptive length"


def test_greedy_outputs_equal_target_outputs(case):
    kind, reference, outputs, _, _ = case
    for i, (ref, out) in enumerate(zip(reference, outputs)):
        assert list(out.outputs[0].token_ids) == ref, f"{kind}: request {i} differs"


def test_spec_decode_counters_agree_with_outputs(case):
    kind, _, outputs, llm, _ = case
    c = spec_counters(llm)
    n = len(outputs)
    produced = sum(len(o.outputs[0].token_ids) for o in outputs)
    # every verify step yields accepted + 1 tokens, the prefill one more per request; a
    # request's last step may overshoot max_tokens by at most K tokens that are dropped.
    upper = n + c["num_drafts"] + c["num_accepted_tokens"]
    assert upper - n * K <= produced <= upper
    # the distilled draft really drafts: text prompts it was trained on accept tokens
    assert c["num_accepted_tokens"] > 0.2 * MAX_TOKENS * len(TRAINED_TEXTS)


def test_draft_cache_does_not_grow_with_video_length(case, target_dirs):
    kind, _, outputs, llm, _ = case
    if FRAMES[kind] is None:
        pytest.skip("text-only target: no video")
    from transformers import AutoConfig

    from vllm_sparrow.targets import target_spec

    visual = set(target_spec(AutoConfig.from_pretrained(target_dirs(kind))).visual_token_ids)
    long_req, short_req = outputs[0], outputs[1]
    long_ids, short_ids = long_req.prompt_token_ids, short_req.prompt_token_ids
    assert len(long_ids) > 5 * len(short_ids), "the long video must add many visual tokens"
    extra_text = (sum(t not in visual for t in long_ids) - sum(t not in visual for t in short_ids))
    entries = text_entries_by_request(llm)
    long_n, short_n = entries[long_req.request_id], entries[short_req.request_id]
    # Both captions have MAX_TOKENS tokens: the streams differ by the prompts' text tokens only.
    # Qwen3-VL writes a text timestamp per frame pair ("<1.0 seconds>"): real text, so the draft
    # caches it; visual placeholders never enter.
    assert kind == "qwen3_vl" or extra_text == 0, f"{kind}: {extra_text} unexpected extra text tokens"
    assert long_n - short_n == extra_text and short_n > MAX_TOKENS


def test_host_bound_on_text_entries_is_tight_and_never_too_low(case):
    """The proposer bounds each request's text entries from the runner's host arrays (sequence
    length less prompt placeholders) so the CPU path reads only the ring rows in use: a bound
    below the truth would hide keys from the draft; a loose one wastes reads."""
    kind, _, outputs, llm, _ = case
    last_bound = {}
    for step in drafter_inputs(llm):
        for r, bound in zip(step["req_ids"], step["text_bound"]):
            last_bound[r.rsplit("-", 1)[0]] = bound
    entries = text_entries_by_request(llm)
    for out in outputs:
        slack = last_bound[out.request_id] - entries[out.request_id]
        assert 0 <= slack <= K, (kind, out.request_id, slack)  # at most the last step's rejected drafts


def test_finished_requests_give_back_their_draft_cache_slots(case):
    kind, _, outputs, llm, _ = case
    # vLLM tells workers about finished requests with the next step: run one more request.
    follow_up = llm.generate([outputs[-1].prompt], SamplingParams(max_tokens=1))[0]
    stats = drafter_stats(llm)
    live = [r.rsplit("-", 1)[0] for r in stats["live_requests"]]
    assert live in ([], [follow_up.request_id])
