"""Under a tiny KV budget (forced preemptions and recomputes) and with aborts, sparrow stays
lossless, video requests included, every draft-cache slot comes back and every KV block of the
target is free again once all requests have ended."""

from conftest import TRAINED_TEXTS, close_llm, make_llm
from vllm import SamplingParams

from support.engine_probe import drafter_stats
from sparrow_world.tiny_targets import make_prompt

KIND = "qwen2_5_vl"
GREEDY = SamplingParams(temperature=0.0, max_tokens=96, ignore_eos=True)


def _prompts(target, clips):
    texts = TRAINED_TEXTS + [f"{w} goes round and round {i}" for i, w in enumerate(
        ["a green triangle", "the yellow dot", "one purple star", "two orange boxes", "a white line",
         "the black circle", "many small squares", "a grey cloud", "a pink heart", "the last frame"])]
    videos = [{"prompt": make_prompt(KIND, target, f"describe video {n}", "video"),
               "multi_modal_data": {"video": clips(n)}} for n in (4, 8)]
    return [make_prompt(KIND, target, t, None) for t in texts[:6]] + videos + \
        [make_prompt(KIND, target, t, None) for t in texts[6:]]


def _run(engine, prompts, abort=()):
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, GREEDY)
    done, steps = {}, 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = list(out.outputs[0].token_ids)
        steps += 1
        if steps == 4 and abort:
            engine.abort_request(list(abort))
    return done


def _preemptions(llm) -> int:
    return int(sum(m.value for m in llm.get_metrics() if m.name == "vllm:num_preemptions"))


def _kv_blocks_in_use(llm) -> int:
    """Target KV blocks still referenced (the pool less its free blocks and the null block)."""
    pool = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_manager.block_pool
    return pool.num_gpu_blocks - 1 - pool.get_num_free_blocks()


def test_lossless_and_all_blocks_free_after_preemptions_and_aborts(target_dirs, trained_drafts, clips):
    target, draft = target_dirs(KIND), trained_drafts(KIND)
    prompts = _prompts(target, clips)
    base = make_llm(target)
    reference = _run(base.llm_engine, prompts)
    close_llm(base)
    llm = make_llm(target, max_model_len=256, num_gpu_blocks_override=10, block_size=32,
                   max_num_batched_tokens=256, disable_log_stats=False,
                   speculative_config={"method": "sparrow", "model": str(draft), "num_speculative_tokens": 3})
    aborted = {"2", "5", "7"}
    outputs = _run(llm.llm_engine, prompts, abort=aborted)
    assert _preemptions(llm) > 0, "the KV budget must force preemptions"
    for rid, tokens in outputs.items():
        assert rid not in aborted
        assert tokens == reference[rid], f"request {rid} differs after preemption/recompute"
    assert set(outputs) == set(reference) - aborted
    assert _kv_blocks_in_use(llm) == 0, "every target KV block must be free once all requests ended"
    # vLLM tells workers about finished/aborted requests with the next step: run one more.
    follow_up = llm.generate([prompts[0]], SamplingParams(max_tokens=1))[0]
    stats = drafter_stats(llm)
    assert [r.rsplit("-", 1)[0] for r in stats["live_requests"]] in ([], [follow_up.request_id])
    assert _kv_blocks_in_use(llm) == 0
    close_llm(llm)
