"""At temperature > 0 sparrow's output distribution is the target's (probabilistic drafting:
the probabilities handed to vLLM's rejection sampler are the ones the draft sampled from)."""

import math

import pytest
from collections import Counter

from conftest import TRAINED_TEXTS, close_llm, make_llm
from vllm import SamplingParams

from vllm_sparrow.testing.engine import spec_counters
from vllm_sparrow.testing.tiny_targets import make_prompt

KIND = "qwen2_5_vl"
N = 800
POSITIONS = (1, 2, 3)  # tokens that come from verified drafts (position 0 comes from prefill)


def _samples(llm, prompt):
    params = [SamplingParams(temperature=0.3, max_tokens=4, seed=i, ignore_eos=True) for i in range(N)]
    outs = llm.generate([prompt] * N, params, use_tqdm=False)
    return [tuple(o.outputs[0].token_ids) for o in outs]


def _chi2_homogeneity(a: Counter, b: Counter) -> tuple[float, int]:
    """Two-sample chi-square statistic and degrees of freedom; rare categories are pooled."""
    na, nb = sum(a.values()), sum(b.values())
    cats, rare_a, rare_b = [], 0, 0
    for k in set(a) | set(b):
        if a[k] + b[k] >= 10:
            cats.append((a[k], b[k]))
        else:
            rare_a, rare_b = rare_a + a[k], rare_b + b[k]
    if rare_a + rare_b:
        cats.append((rare_a, rare_b))
    stat = 0.0
    for ca, cb in cats:
        tot = ca + cb
        ea, eb = tot * na / (na + nb), tot * nb / (na + nb)
        stat += (ca - ea) ** 2 / ea + (cb - eb) ** 2 / eb
    return stat, len(cats) - 1


def _chi2_critical(df: int, z: float = 3.09) -> float:
    """Upper quantile (p = 0.001 for z = 3.09) by the Wilson-Hilferty approximation."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


@pytest.mark.xfail(strict=True, reason=(
    "KNOWN VIOLATION under investigation: at T>0 on the CPU build, outputs with sparrow are "
    "distributed differently from the target's (chi2 >> critical), with greedy and with "
    "probabilistic drafting alike; vLLM's CPU rejection sampler alone is correct on synthetic "
    "inputs. Greedy (T=0) output is exact. See README 'Known problems'."))
def test_sampled_tokens_follow_the_target_distribution(target_dirs, trained_drafts):
    target, draft = target_dirs(KIND), trained_drafts(KIND)
    prompt = make_prompt(KIND, target, TRAINED_TEXTS[0], None)
    base = make_llm(target, max_num_seqs=64)
    reference = _samples(base, prompt)
    close_llm(base)
    llm = make_llm(target, max_num_seqs=64, disable_log_stats=False, speculative_config={
        "method": "sparrow", "model": str(draft), "num_speculative_tokens": 3,
        "draft_sample_method": "probabilistic"})
    sparrow = _samples(llm, prompt)
    counters = spec_counters(llm)
    close_llm(llm)
    # The tiny random target's distributions are flat and the quick draft only learned greedy
    # paths, so acceptance is low here; what matters is that accepted drafts are exercised.
    assert counters["num_accepted_tokens"] > 0, counters
    for pos in POSITIONS:
        stat, df = _chi2_homogeneity(Counter(s[pos] for s in reference), Counter(s[pos] for s in sparrow))
        assert df >= 3, "the distribution must not be degenerate for the test to mean anything"
        assert stat < _chi2_critical(df), f"token {pos}: chi2={stat:.1f} df={df}"
