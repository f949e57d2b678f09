"""On every supported target, in a real engine: greedy outputs with sparrow equal outputs without
speculation, token for token, and every draft the proposer hands vLLM is what the training model
drafts from the same committed states (a dense recomputation over the request's text stream,
tests/support/dense_reference.py), for a batch that mixes a long and a short video, an image, a text
prompt longer than the draft's window and short text prompts; the sparrow engine is squeezed so
that prompts are prefilled in chunks, requests are preempted and recomputed, and more requests
than draft slots pass through (slots are reused). vLLM's spec-decode counters agree with the
outputs, acceptance stays at its measured level, and the draft cache holds exactly the text
positions (counted from the prompt's own placeholder tokens, no target exempted)."""

import pytest
from conftest import close_llm, make_llm
from vllm import SamplingParams

from support.dense_reference import StreamReplay, check_engine_drafts, placeholder_ids
from support.engine_probe import (
    drafter_inputs,
    drafter_stats,
    record_drafter_inputs,
    spec_counters,
    text_entries_by_request,
)
from support.lossless_batch import ACCEPTED, FRAMES, GREEDY, K, SEQS, requests, squeezed


@pytest.fixture(scope="module", params=sorted(FRAMES))
def case(request, target_dirs, trained_drafts, clips):
    from transformers import AutoTokenizer

    kind = request.param
    target, draft = target_dirs(kind), trained_drafts(kind)
    reqs = requests(kind, target, clips)
    base = make_llm(target)  # the plain engine first: upstream needs that order in one process
    plain = base.generate(reqs, GREEDY)
    reference = [list(o.outputs[0].token_ids) for o in plain]
    close_llm(base)
    tree = _deep_tree_adaptive_outputs(target, draft, reqs)
    llm = make_llm(target, disable_log_stats=False, **squeezed(kind, plain),
                   speculative_config={"method": "sparrow", "model": str(draft), "num_speculative_tokens": K})
    record_drafter_inputs(llm)
    outputs = llm.generate(reqs, GREEDY)
    visual = placeholder_ids(kind, AutoTokenizer.from_pretrained(str(target)))
    # steps: a copy of the record, which goes on growing (the slot test's follow-up request)
    yield dict(kind=kind, target=target, draft=draft, reference=reference, outputs=outputs, llm=llm, tree=tree,
               visual=visual, steps=list(drafter_inputs(llm)), entries=text_entries_by_request(llm),
               preemptions=int(sum(m.value for m in llm.get_metrics() if m.name == "vllm:num_preemptions")))
    close_llm(llm)


DEEP_K = 16  # the deeper-drafts engine: the plugin's deepest depth, tree search, adaptive length, all at once


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


def _replay(case) -> StreamReplay:
    lens = {o.request_id: len(o.prompt_token_ids) for o in case["outputs"]}
    return StreamReplay(case["visual"], lens)


def test_deep_tree_search_with_adaptive_length_equals_target_outputs(case):
    tree, counters, outputs = case["tree"]
    assert tree == [3, 3 * (DEEP_K - 1)], "the engine must have drafted by tree search"
    per_step = counters["num_draft_tokens"] / counters["num_drafts"]
    assert 1 <= per_step < DEEP_K, f"{case['kind']}: adaptive length must cut some chains ({per_step:.2f} per step)"
    for i, (ref, out) in enumerate(zip(case["reference"], outputs)):
        assert out == ref, f"{case['kind']}: request {i} differs with deep drafts, tree search and adaptive length"


def test_greedy_outputs_equal_target_outputs(case):
    for i, (ref, out) in enumerate(zip(case["reference"], case["outputs"])):
        assert list(out.outputs[0].token_ids) == ref, f"{case['kind']}: request {i} differs"


def test_every_draft_equals_the_training_models_dense_reference(case):
    """The drafts (and their logits) of every step, chunked prefills, preemptions and reused slots
    included, equal the training model's from the same committed states."""
    from vllm_sparrow.checkpoint import load_draft
    from vllm_sparrow.training.target_runner import HFTarget

    io = HFTarget(str(case["target"]))  # the target's embedding and LM head, read by transformers
    counts = check_engine_drafts(case["steps"], _replay(case), load_draft(case["draft"]), io)
    assert counts["drafting"] > 50, counts
    assert counts["prefill_rows"] > 0, "some steps must have carried a prompt chunk that continues"
    assert counts["restarts"] > 0 and case["preemptions"] > 0, "requests must have been preempted and recomputed"
    assert len({r for s in case["steps"] for r in s["req_ids"]}) > SEQS, "more requests than draft slots"
    assert max(len(s["req_ids"]) for s in case["steps"]) == SEQS, "the batch must fill every slot"


def test_spec_decode_counters_agree_with_outputs(case):
    c, outputs = spec_counters(case["llm"]), case["outputs"]
    n = len(outputs)
    produced = sum(len(o.outputs[0].token_ids) for o in outputs)
    # every verify step yields accepted + 1 tokens, each prefill one more per request (a
    # preempted request's recompute yields one too); a request's last step may overshoot
    # max_tokens by at most K tokens that are dropped.
    upper = n + case["preemptions"] + c["num_drafts"] + c["num_accepted_tokens"]
    assert upper - (n + case["preemptions"]) * K <= produced <= upper, (produced, upper, c)


def test_acceptance_stays_at_its_measured_level(case):
    """The distilled draft accepts what it accepted when measured: a draft that drafts wrong
    tokens, loses cache entries or reads visual rows falls below the floor."""
    accepted = spec_counters(case["llm"])["num_accepted_tokens"]
    print(f"{case['kind']}: {accepted} draft tokens accepted")
    assert accepted >= 0.8 * ACCEPTED[case["kind"]], accepted


def test_the_draft_cache_holds_the_text_positions_only(case):
    """Each request's committed entries equal its text stream (the replay's count), and, for a
    request never preempted, its prompt's non-placeholder tokens plus its output, whatever the
    video length: the long video's placeholders never enter."""
    replay, entries = _replay(case), case["entries"]
    for step in case["steps"]:
        replay.step(step)
    for out in case["outputs"]:
        rid = out.request_id
        engine_id = next(r for r in replay.streams if r.rsplit("-", 1)[0] == rid)
        assert entries[rid] == replay.committed(engine_id), (case["kind"], rid)
        if replay.streams[engine_id].restarts == 0:
            text = sum(t not in case["visual"] for t in out.prompt_token_ids)
            low = text + len(out.outputs[0].token_ids) - 1  # every state whose next token is known
            assert low <= entries[rid] <= low + K, (case["kind"], rid, entries[rid], low)  # + the last step's overshoot
    if FRAMES[case["kind"]] is not None:
        long_ids = case["outputs"][0].prompt_token_ids
        assert sum(t in case["visual"] for t in long_ids) >= 256, "the long video must bring many placeholders"
        assert entries[case["outputs"][0].request_id] < len(long_ids) - 256


def test_host_bound_on_text_entries_is_tight_and_never_too_low(case):
    """The proposer bounds each request's text entries from the runner's host arrays (sequence
    length less prompt placeholders) so the CPU path reads only the ring rows in use: a bound
    below the truth would hide keys from the draft; a loose one wastes reads."""
    last_bound = {}
    for step in case["steps"]:
        for r, bound in zip(step["req_ids"], step["text_bound"]):
            last_bound[r.rsplit("-", 1)[0]] = bound
    replay = _replay(case)
    for step in case["steps"]:
        replay.step(step)
    for out in case["outputs"]:
        slack = last_bound[out.request_id] - case["entries"][out.request_id]
        restarted = any(s.restarts for r, s in replay.streams.items() if r.rsplit("-", 1)[0] == out.request_id)
        assert slack >= 0, (case["kind"], out.request_id, slack)
        # at most the last step's rejected drafts; a request recomputed from a prefix-cache hit
        # restarted its stream there, so its bound (the whole sequence) is loose, never low
        assert restarted or slack <= K, (case["kind"], out.request_id, slack)


def test_finished_requests_give_back_their_draft_cache_slots(case):
    llm, outputs = case["llm"], case["outputs"]
    # vLLM tells workers about finished requests with the next step: run one more request.
    follow_up = llm.generate([outputs[-1].prompt], SamplingParams(max_tokens=1))[0]
    stats = drafter_stats(llm)
    live = [r.rsplit("-", 1)[0] for r in stats["live_requests"]]
    assert live in ([], [follow_up.request_id])
