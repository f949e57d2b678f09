"""On CUDA, in the configuration Sparrow is served in: vLLM's CUDA graphs on (enforce_eager=False:
vLLM's compiled, graph-captured target, and draft_graphs.DecodeGraphs replaying the drafter's
decode steps) and bfloat16, at batch 7 (text prompts, one longer than the draft's window, and a
short video), requests finishing at different lengths so the decode batch shrinks through the
graph buckets.

What is exactly comparable in bf16. Greedy speculative decoding emits, at each position, the
argmax of the target's logits as the sparrow engine computed them, in a verify pass of K + 1
rows per request. The plain engine computes the same position in a decode step of one row per
request, and bf16 matmuls and attention of other shapes round differently, so the two argmaxes
may differ where the target's two best logits lie within rounding of each other. (vLLM's own
spec-decode tests compare with the target run under the same engine settings and tolerate some
mismatch for this reason.) So this pins:

1. exactly, whatever the numerics: every token the sparrow engine emits is rank 1 among the
   target logprobs vLLM returns from that engine's own verify steps (an accepted draft token the
   target did not choose, or a bonus token taken from the wrong row, fails here);
2. token for token against the target without speculation, run with the same engine settings
   (CUDA graphs, bf16, batch limits) and the same requests in the same order: equal, except that a
   request may part from the reference at a near tie, a position where the reference's two best
   tokens are less than NEAR_TIE apart in logprob and the sparrow engine took the second; what
   follows a parting is not comparable. At least half of the requests must match entirely;
3. the paths under test ran: vLLM's graphs were on, the drafter's decode graphs were captured for
   every bucket and replayed (counted at the graphs themselves, not at the eager static-buffer
   path), and drafts were accepted.

On CPU vLLM runs eagerly in float32; the static-buffer path the graphs replay is checked there by
test_draft_graph_buckets_draft_like_eager.py.
"""

import pytest
from conftest import TRAINED_TEXTS, close_llm, make_llm, on_cuda
from vllm import SamplingParams

from support.engine_probe import spec_counters
from sparrow_world.tiny_targets import make_prompt

pytestmark = pytest.mark.skipif(not on_cuda(), reason="CUDA graphs and bfloat16 are the GPU configuration: "
                                "needs CUDA (on CPU vLLM runs eagerly, and the suite in float32)")

KIND = "qwen2_5_vl"
K = 3
# Longer than the trained draft's window (64 text tokens): the window slides inside the prompt.
LONG_TEXT = " ".join(f"then the {c} {s} moves {d}" for c, s, d in zip(
    ["red", "blue", "green", "yellow", "white"] * 5, ["square", "circle", "star", "line", "dot"] * 5,
    ["left", "right", "up", "down", "round"] * 5))
TEXTS = [*TRAINED_TEXTS, LONG_TEXT, "a green triangle turns around", "what happens after the red square",
         "the yellow dot stops"]
# Both engines: everything but speculation the same, so prefill steps have the same shapes.
ENGINE = dict(enforce_eager=False, dtype="bfloat16", max_num_seqs=8, disable_log_stats=False)
# Logprob gap (nats) under which two tokens count as tied in bf16: logits are bf16 values, spaced
# 0.0625 to 0.125 apart at the magnitudes these targets produce, and shape-dependent rounding in
# the layers below moves them by a few such steps. A corrupted target (stale inputs, a KV cache
# written over) moves them by far more.
NEAR_TIE = 0.5


def _requests(target, clips):
    reqs = [{"prompt": make_prompt(KIND, target, t, None)} for t in TEXTS]
    reqs.append({"prompt": make_prompt(KIND, target, "describe the video", "video"),
                 "multi_modal_data": {"video": clips(4)}})
    # Different lengths: the decode batch shrinks from 7 requests to 1 (graph buckets 8, 4, 2, 1).
    params = [SamplingParams(temperature=0.0, max_tokens=16 + 8 * i, ignore_eos=True, logprobs=2)
              for i in range(len(reqs))]
    return reqs, params


class _CountingGraph:
    """A captured CUDA graph that counts its replays."""

    def __init__(self, graph) -> None:
        self.graph, self.replays = graph, 0

    def replay(self) -> None:
        self.replays += 1
        self.graph.replay()


def _count_graph_replays(worker):
    graphs = getattr(worker.model_runner.drafter.served.drafting, "graphs", None)
    if graphs is None:
        return None
    graphs.graphs = {b: _CountingGraph(g) for b, g in graphs.graphs.items()}
    return {"buckets": list(graphs.buckets), "captured": sorted(graphs.graphs), "capture": graphs.capture_enabled}


def _graph_replays(worker) -> dict[int, int]:
    return {b: g.replays for b, g in worker.model_runner.drafter.served.drafting.graphs.graphs.items()}


@pytest.fixture(scope="module")
def runs(target_dirs, trained_drafts, clips):
    target, draft = target_dirs(KIND), trained_drafts(KIND)
    reqs, params = _requests(target, clips)
    base = make_llm(target, **ENGINE)  # the plain engine first: upstream needs that order in one process
    plain = base.generate(reqs, params, use_tqdm=False)
    close_llm(base)
    llm = make_llm(target, **ENGINE, speculative_config={
        "method": "sparrow", "model": str(draft), "num_speculative_tokens": K})
    config = llm.llm_engine.vllm_config
    vllm_graphs = (config.model_config.enforce_eager, config.compilation_config.cudagraph_mode.name)
    graphs = llm.collective_rpc(_count_graph_replays)[0]
    outputs = llm.generate(reqs, params, use_tqdm=False)
    replays = llm.collective_rpc(_graph_replays)[0] if graphs is not None else None
    counters = spec_counters(llm)
    close_llm(llm)
    return dict(plain=[o.outputs[0] for o in plain], sparrow=[o.outputs[0] for o in outputs],
                vllm_graphs=vllm_graphs, graphs=graphs, replays=replays, counters=counters)


def test_every_emitted_token_is_the_targets_argmax_in_its_own_verify_step(runs):
    for i, out in enumerate(runs["sparrow"]):
        assert len(out.token_ids) == 16 + 8 * i
        for pos, (token, logprobs) in enumerate(zip(out.token_ids, out.logprobs)):
            assert logprobs[token].rank == 1, f"request {i}, token {pos}: rank {logprobs[token].rank}"


def test_greedy_outputs_equal_the_target_without_speculation_up_to_bf16_near_ties(runs):
    whole, partings = 0, []
    for i, (ref, out) in enumerate(zip(runs["plain"], runs["sparrow"])):
        ref_ids, ids = list(ref.token_ids), list(out.token_ids)
        assert len(ids) == len(ref_ids), i
        first = next((p for p, (a, b) in enumerate(zip(ref_ids, ids)) if a != b), None)
        if first is None:
            whole += 1
            continue
        top = ref.logprobs[first]
        ours = top.get(ids[first])
        assert ours is not None and ours.rank == 2, (
            f"request {i} parts at token {first} with a token outside the reference's two best: {ids[first]}")
        gap = top[ref_ids[first]].logprob - ours.logprob
        assert gap < NEAR_TIE, f"request {i} parts at token {first}, where the reference was {gap:.3f} nats sure"
        partings.append((i, first, round(gap, 4)))
    print(f"{whole} of {len(runs['plain'])} requests equal throughout; partings at near ties: {partings}")
    assert whole >= len(runs["plain"]) / 2, partings


def test_cuda_graphs_were_on_and_the_drafters_decode_graphs_were_replayed(runs):
    enforce_eager, mode = runs["vllm_graphs"]
    assert not enforce_eager and mode != "NONE", runs["vllm_graphs"]
    graphs = runs["graphs"]
    assert graphs is not None and graphs["capture"], "the drafter must decode through CUDA graphs here"
    assert graphs["captured"] == graphs["buckets"], graphs  # every bucket captured at vLLM's capture
    replays = runs["replays"]
    print(f"decode graph replays by bucket: {replays}")
    # the longest request alone needs this many decode steps even if every draft is accepted
    longest = max(len(out.token_ids) for out in runs["sparrow"])
    assert sum(replays.values()) >= (longest - 1) // (K + 1), replays
    assert sum(1 for n in replays.values() if n > 0) >= 3, f"the shrinking batch must use several buckets: {replays}"
    assert runs["counters"]["num_accepted_tokens"] > 0, runs["counters"]
