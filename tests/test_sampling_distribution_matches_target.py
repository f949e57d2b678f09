"""At temperature > 0 sparrow's output distribution is the target's, with greedy and with
probabilistic drafting, and greedy requests batched with sampled ones stay exact.

This caught a vLLM 0.32 CPU bug (patch cpu-expand-kernel-dtype): the rejection sampler's
per-token temperatures were uninitialised memory, so every T > 0 spec-decode run sampled from a
wrong distribution (chi2 ~ 1160 on 16 df here before the fix).
"""

from collections import Counter

import pytest
from conftest import TRAINED_TEXTS, close_llm, make_llm
from distribution_checks import chi2_critical, chi2_homogeneity
from vllm import SamplingParams

from engine_probe import spec_counters
from sparrow_world.tiny_targets import make_prompt

KIND = "qwen2_5_vl"
N = 800
POSITIONS = (1, 2, 3)  # tokens that come from verified drafts (position 0 comes from prefill)
GREEDY_TEXTS = TRAINED_TEXTS + ["a green triangle turns around"]


def _run(llm, target):
    """N seeded T=0.3 samples of one prompt, plus greedy requests in the same batch."""
    sampled = make_prompt(KIND, target, TRAINED_TEXTS[0], None)
    greedy = [make_prompt(KIND, target, t, None) for t in GREEDY_TEXTS]
    params = [SamplingParams(temperature=0.3, max_tokens=4, seed=i, ignore_eos=True) for i in range(N)]
    params += [SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)] * len(greedy)
    outs = llm.generate([sampled] * N + greedy, params, use_tqdm=False)
    tokens = [tuple(o.outputs[0].token_ids) for o in outs]
    return tokens[:N], tokens[N:]


@pytest.fixture(scope="module")
def reference(target_dirs):
    target = target_dirs(KIND)
    base = make_llm(target, max_num_seqs=64)
    samples, greedy = _run(base, target)
    close_llm(base)
    return samples, greedy


@pytest.mark.parametrize("draft_sample_method", ["greedy", "probabilistic", "greedy-deep-tree-adaptive"])
def test_sampled_tokens_follow_the_target_distribution(draft_sample_method, reference,
                                                       target_dirs, trained_drafts, monkeypatch):
    """greedy-deep-tree-adaptive: 6 greedy drafts by tree search, cut by adaptive length (a
    deterministic draft of varying length: vLLM verifies it as a point mass at any temperature)."""
    target, draft = target_dirs(KIND), trained_drafts(KIND)
    ref_samples, ref_greedy = reference
    k = 3
    if draft_sample_method == "greedy-deep-tree-adaptive":
        monkeypatch.setenv("SPARROW_TREE_TOPK", "3")
        monkeypatch.setenv("SPARROW_STOP_CONFIDENCE", "0.5")
        draft_sample_method, k = "greedy", 6
    llm = make_llm(target, max_num_seqs=64, disable_log_stats=False, speculative_config={
        "method": "sparrow", "model": str(draft), "num_speculative_tokens": k,
        "draft_sample_method": draft_sample_method})
    samples, greedy = _run(llm, target)
    counters = spec_counters(llm)
    close_llm(llm)
    assert greedy == ref_greedy, "greedy requests batched with sampled ones must stay exact"
    # The tiny random target's distributions are flat and the quick draft only learned greedy
    # paths, so acceptance is modest here; what matters is that accepted drafts are exercised.
    assert counters["num_accepted_tokens"] > 0, counters
    for pos in POSITIONS:
        stat, df = chi2_homogeneity(Counter(s[pos] for s in ref_samples), Counter(s[pos] for s in samples))
        assert df >= 3, "the distribution must not be degenerate for the test to mean anything"
        assert stat < chi2_critical(df), f"token {pos}: chi2={stat:.1f} df={df}"
