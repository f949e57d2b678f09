"""Sparrow stays lossless when a video prompt is prefilled in several chunks (the drafter holds a
text state across the chunk boundary) and when a request starts on a prefix-cache hit (the
drafter never saw the cached states and starts its text stream at the first computed token)."""

import pytest
from conftest import TRAINED_TEXTS, close_llm, make_llm
from vllm import SamplingParams

from support.engine_probe import drafter_stats
from sparrow_world.tiny_targets import make_prompt

KIND = "qwen2_5_vl"
CHUNK = 64  # max_num_batched_tokens: every prompt below is prefilled in several steps
GREEDY = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
LONG_TEXT = " ".join(f"then the {c} {s} moves {d}" for c, s, d in zip(
    ["red", "blue", "green", "yellow"] * 4, ["square", "circle", "star", "line"] * 4,
    ["left", "right", "up", "down"] * 4))
ENGINE = dict(max_num_batched_tokens=CHUNK, max_num_seqs=4, enable_prefix_caching=True,
              long_prefill_token_threshold=CHUNK, block_size=32, max_model_len=2048)


def _requests(target, clips):
    video = {"video": clips(8)}  # 64 visual tokens: the video itself straddles chunk edges
    return [
        {"prompt": make_prompt(KIND, target, LONG_TEXT, "video"), "multi_modal_data": video},
        {"prompt": make_prompt(KIND, target, TRAINED_TEXTS[0] + " " + LONG_TEXT, None)},
        {"prompt": make_prompt(KIND, target, TRAINED_TEXTS[1], "video"), "multi_modal_data": video},
    ]


def _counter(llm, name: str) -> int:
    return int(sum(m.value for m in llm.get_metrics() if m.name == name))


@pytest.fixture(scope="module")
def runs(target_dirs, trained_drafts, clips):
    target, draft = target_dirs(KIND), trained_drafts(KIND)
    reqs = _requests(target, clips)
    outs = {}
    for name, spec in (("plain", None), ("sparrow", {
            "method": "sparrow", "model": str(draft), "num_speculative_tokens": 3})):
        llm = make_llm(target, disable_log_stats=False, speculative_config=spec, **ENGINE)
        first = [list(o.outputs[0].token_ids) for o in llm.generate(reqs, GREEDY)]
        # Same prompts again: their full blocks are now prefix-cache hits.
        hits_before = _counter(llm, "vllm:prefix_cache_hits")
        second = [list(o.outputs[0].token_ids) for o in llm.generate(reqs, GREEDY)]
        hits = _counter(llm, "vllm:prefix_cache_hits") - hits_before
        llm.generate([reqs[1]["prompt"]], SamplingParams(max_tokens=1))  # flush finished ids
        outs[name] = dict(first=first, second=second, hits=hits,
                          prompt_lens=[len(o.prompt_token_ids) for o in llm.generate(reqs, SamplingParams(max_tokens=1))],
                          stats=drafter_stats(llm) if spec else None)
        close_llm(llm)
    return outs


def test_chunked_prefill_outputs_equal_target_outputs(runs):
    assert min(runs["plain"]["prompt_lens"]) > CHUNK, "each prompt must need more than one chunk"
    assert runs["sparrow"]["first"] == runs["plain"]["first"]


def test_prefix_cache_hit_outputs_equal_target_outputs(runs):
    assert runs["sparrow"]["hits"] > 0, "the second pass must hit the prefix cache"
    assert runs["sparrow"]["second"] == runs["plain"]["second"] == runs["plain"]["first"]
    assert len(runs["sparrow"]["stats"]["live_requests"]) <= 1
