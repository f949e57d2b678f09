"""benchmarks/mtp_depth.py reads every shallower depth off one depth-16 replay: a chain cut at K'
accepts exactly the positions 1..K' of the deep chain (position i needs 1..i-1), so its tokens per
step and each position's conditional acceptance come from the per-position counts."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import mtp_depth  # noqa: E402

from vllm_sparrow.training.acceptance import AcceptanceEstimate  # noqa: E402


def test_a_cut_chain_counts_only_its_own_positions():
    # 10 drafts: accepted at position 1 by 8, at 2 by 6, at 3 by 3, at 4 by none
    row = {"drafts": 10, "per_position": [8, 6, 3, 0]}
    est = AcceptanceEstimate(drafts=10, accepted=17, per_position=[8, 6, 3, 0])
    assert mtp_depth.tokens_per_step(row, 4) == pytest.approx(est.mean_acceptance_length)  # the whole chain
    assert mtp_depth.tokens_per_step(row, 1) == pytest.approx(1.8)
    assert mtp_depth.tokens_per_step(row, 2) == pytest.approx(2.4)


def test_conditional_acceptance_divides_by_the_position_before():
    row = {"drafts": 10, "per_position": [8, 6, 3, 0]}
    assert [mtp_depth.conditional(row, p) for p in (1, 2, 3, 4)] == pytest.approx([0.8, 0.75, 0.5, 0.0])


def test_the_table_averages_seeds_per_mtp_setting():
    rows = [{"mtp_steps": 2, "seed": s, "drafts": 10, "per_position": pp}
            for s, pp in ((0, [8, 6, 3, 0]), (1, [6, 4, 1, 1]))]
    result = {"settings": {"k": 4, "mtp": [2, 4]}, "records": rows}
    lines = mtp_depth.table(result).splitlines()
    assert len(lines) == 3  # header, rule, the one MTP setting measured
    assert lines[2].startswith("| 2 | 2 | 2.45 |")  # (2.7 + 2.2) / 2 tokens per step at depth 4
