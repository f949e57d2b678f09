"""The depth a trained draft recommends (its config.json `speculative_tokens`, what the plugin
drafts when the user gives no num_speculative_tokens), chosen from its held-out replay.

The replay (acceptance.py) drafts chains of K_max tokens and counts, per position i, the drafts
whose first i tokens were all accepted. Under greedy verification a chain of k < K_max tokens is
accepted exactly as far as the first k tokens of the longer one, so one replay at K_max gives the
expected tokens per verify step at every depth (bonus token included):

    tokens(k) = 1 + sum_{i <= k} accepted_at[i] / drafts

A step that drafts k tokens costs the verify step's fixed cost (1), k draft forwards
(draft_step_cost each) and k more verified tokens (verify_token_cost each, the marginal cost
`sparrow calibrate-stop` uses), so the rate is

    speed(k) = tokens(k) / (1 + k * (draft_step_cost + verify_token_cost))

and the recommended depth is the k that maximises it (the shallowest of equals). Worked example:
per-position acceptance 0.9, 0.8, 0.5, 0.2 of 100 drafts and costs 0.1 + 0.1: tokens = 1.9, 2.7,
3.2, 3.4; speed = 1.58, 1.93, 2.00, 1.89, so depth 3.

The costs are the serving hardware's, not the draft's: the defaults fit a one-layer draft of a
7B target on a GPU at small batch (a draft forward reads ~1/10 of the target's weights; one more
verified token costs ~1/10 of a step). Measure yours (vLLM's draft and step times) and rerun the
finished `sparrow train` with --draft-step-cost / --verify-token-cost (it trains nothing more:
it replays and records the depth again), or set the depth with --k.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import MAX_SPECULATIVE_TOKENS
from .acceptance import AcceptanceEstimate


@dataclass
class DepthChoice:
    depth: int  # the recommended speculative_tokens
    tokens_per_step: list[float]  # [K_max] expected tokens per verify step drafting 1..K_max (bonus incl.)
    speed: list[float]  # [K_max] tokens per unit of step cost at depth 1..K_max

    def summary(self) -> str:
        rows = ", ".join(f"K={k}: {t:.2f} tok/step, {s:.2f}" for k, (t, s) in
                         enumerate(zip(self.tokens_per_step, self.speed), 1))
        return f"recommended depth {self.depth} (tokens per step and per unit of step cost: {rows})"


def choose_depth(est: AcceptanceEstimate, draft_step_cost: float, verify_token_cost: float) -> DepthChoice:
    """The depth with the most tokens per unit of step cost, from a replay at depth len(per_position)."""
    if not est.drafts:
        raise ValueError("the replay made no drafts: no held-out sample is long enough to choose a depth from")
    tokens, accepted = [], 0
    for count in est.per_position:
        accepted += count
        tokens.append(1 + accepted / est.drafts)
    speed = [t / (1 + k * (draft_step_cost + verify_token_cost)) for k, t in enumerate(tokens, 1)]
    return DepthChoice(1 + speed.index(max(speed)), tokens, speed)


def depth_schedule(est: AcceptanceEstimate, token_costs: dict[int, tuple[float, float]]) -> list[list[int]]:
    """vLLM's per-batch-size schedule [[first batch size, last, depth], ...] from one replay and,
    at each measured batch size, the cost of one more draft forward and of one more verified
    token (relative to the step's fixed cost there: `step_cost.StepCost.draft_token` and
    `verify_token`). Each measured batch size's depth covers it up to the next one's; the last
    reaches every larger batch (vLLM carries it on).
    Worked example: costs {1: (0.03, 0.02), 16: (0.1, 0.3), 64: (0.5, 1.5)} (their sums 0.05, 0.4,
    2.0) with the module docstring's replay give depths 4, 2, 1: [[1, 15, 4], [16, 63, 2], [64, 64, 1]]."""
    sizes = sorted(token_costs)
    if not sizes or sizes[0] != 1:
        raise ValueError(f"measure batch size 1 first (vLLM's schedule starts there), got {sizes}")
    entries = []
    for size, nxt in zip(sizes, sizes[1:] + [sizes[-1] + 1]):
        depth = choose_depth(est, *token_costs[size]).depth
        if entries and entries[-1][2] == depth:
            entries[-1][1] = nxt - 1  # same depth as the batch sizes below: one range
        else:
            entries.append([size, nxt - 1, depth])
    return entries


@dataclass
class TreeVerdict:
    """Would verifying a tree pay on a machine with these costs (the rule of docs/benchmarks.md):
    a plan that verifies N tokens after D sequential draft forwards reaches tau tokens per step and
    tau / (1 + N v + D d) per unit of step cost (v: one more verified token, d: one more draft
    forward, both relative to a one-token step); a chain of k has N = D = k."""

    draft_forward_cost: float  # d
    verify_token_cost: float  # v
    best_chain: int  # k of the best chain at (d, v)
    chain_speed: float  # its tokens per unit of step cost
    tree_speed: dict[int, float]  # nodes N -> tokens per unit of step cost
    break_even_v: dict[int, float | None]  # N -> the v below which the tree beats every chain (None: never)

    @property
    def best(self) -> str:
        """"chain k" or "tree N": the plan with the most tokens per unit of step cost."""
        if not self.tree_speed:
            return f"chain {self.best_chain}"
        n, speed = max(self.tree_speed.items(), key=lambda kv: kv[1])
        return f"tree {n}" if speed > self.chain_speed else f"chain {self.best_chain}"


def plan_speed(tau: float, verified: int, forwards: int, d: float, v: float) -> float:
    return tau / (1 + verified * v + forwards * d)


def tree_verdict(chains: dict[int, float], trees: dict[int, tuple[float, int]], d: float, v: float,
                 v_max: float = 4.0) -> TreeVerdict:
    """chains: depth k -> tau; trees: nodes N -> (tau, D draft forwards). The best chain and each
    tree at (d, v), and each tree's break-even v at this d (bisection below v_max: a tree verifies
    more tokens than the chains it competes with, so it wins below some v and loses above it)."""

    def best_chain(v_: float) -> tuple[int, float]:
        return max(((k, plan_speed(t, k, k, d, v_)) for k, t in chains.items()), key=lambda kv: kv[1])

    def margin(n: int, v_: float) -> float:
        tau, forwards = trees[n]
        return plan_speed(tau, n, forwards, d, v_) - best_chain(v_)[1]

    k, speed = best_chain(v)
    even = {}
    for n in trees:
        if margin(n, 0.0) <= 0:
            even[n] = None  # not even free verification makes it pay
            continue
        lo, hi = 0.0, v_max
        if margin(n, hi) > 0:
            even[n] = v_max  # wins everywhere measured
            continue
        for _ in range(40):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if margin(n, mid) > 0 else (lo, mid)
        even[n] = lo
    return TreeVerdict(d, v, k, speed, {n: plan_speed(t, n, D, d, v) for n, (t, D) in trees.items()}, even)


def replay_depth(speculative_tokens: int | None) -> int:
    """K of the validation replay: the depth asked for, else the deepest the plugin serves (one
    replay at the deepest depth measures every shallower one)."""
    return speculative_tokens or MAX_SPECULATIVE_TOKENS
