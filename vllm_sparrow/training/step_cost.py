"""What one more drafted token costs on this machine, measured in vLLM (`sparrow tune`), the draft's
share and the verifier's apart.

The depth rule (depth.py) needs, per batch size, the cost of a step that drafts k tokens:

    step(k) = fixed + k x (draft + verify)   fixed: the step without drafts; draft: one more draft
                                             forward (and its LM head); verify: one more token the
                                             target verifies

They change with the hardware and the batch, and differently: on a GPU at batch 1 a 7B verify
step is bound by reading its weights, so verifying 9 tokens costs about what verifying 1 does,
while each draft forward is a sequential launch; at batch 64 every verified token counts. A
chain's choice sees only their sum, but a tree (N verified nodes at depth D: 1 + N verify +
D draft) does not, and neither does any choice between drafting more and verifying more. So
they are measured, not assumed: the real engine serves the draft at several depths (tune's
default: 1, the middle and the deepest), `batch` requests decode together, and the median time of
their decode steps at each depth gives the least-squares line through those points, and the
drafter's own time inside those steps (engine_stats.time_drafting: synchronised on CUDA) gives the
draft's line; the verifier's is the difference. The line's worst miss at a timed depth is
reported beside it (describe: line_miss): a line through depths 1 and 16 alone priced every depth
between as if the cost were linear, and nothing said whether it was.

A decode step is one `LLMEngine.step()` after every request of the batch has its first token
(so no prefill is inside) while all of them still run (max_tokens keeps them running); the
first `WARMUP_STEPS` are not timed (first-call allocations).

Each depth's engine is started `rounds` times, the order of depths reversed every other round
(1, 8, 16, 16, 8, 1, ...), and a
depth's cost is its fastest start's: engines vary from start to start (on a 2-core CPU one tune
run's depth-1 engine ran 1.6-1.9x slower at every batch size than the same engine in two other
runs, and that run chose depth 8 at batch 16 where the others chose 2-3), and one slow start
would otherwise become the cost line.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any

WARMUP_STEPS = 2


@dataclass
class StepCost:
    batch: int
    seconds: dict[int, float] = field(default_factory=dict)  # depth -> seconds per decode step (fastest start's)
    rounds: dict[int, list[float]] = field(default_factory=dict)  # depth -> each engine start's median
    draft_seconds: dict[int, float] = field(default_factory=dict)  # depth -> the drafter's seconds in that step

    def line(self) -> tuple[float, float]:
        """(fixed, per_token) seconds: the least-squares line through every measured depth."""
        return _line(self.seconds, self.batch)

    @property
    def line_miss(self) -> float:
        """The line's largest miss at a measured depth, relative to that depth's measured step
        (0: the cost is linear in depth as far as the timings tell)."""
        fixed, per_token = self.line()
        return max(abs(fixed + k * per_token - t) / t for k, t in self.seconds.items())

    @property
    def per_token(self) -> float:
        """One more drafted-and-verified token, relative to the step's fixed cost."""
        fixed, per_token = self.line()
        return per_token / fixed

    @property
    def draft_token(self) -> float:
        """One more draft forward, relative to the step's fixed cost (the slope of the drafter's own
        time); 0 when the drafter was not timed."""
        if len(self.draft_seconds) < 2:
            return 0.0
        return min(_line(self.draft_seconds, self.batch)[1] / self.line()[0], self.per_token)

    @property
    def verify_token(self) -> float:
        """One more verified token, relative to the step's fixed cost: the rest of per_token."""
        return self.per_token - self.draft_token


def _line(seconds: dict[int, float], batch: int) -> tuple[float, float]:
    """(fixed, per_token): the least-squares line through (depth, seconds); with two depths, the
    line through both."""
    if len(seconds) < 2:
        raise ValueError(f"batch {batch}: two depths are needed, measured {sorted(seconds)}")
    n = len(seconds)
    mean_k, mean_t = sum(seconds) / n, sum(seconds.values()) / n
    slope = (sum((k - mean_k) * (t - mean_t) for k, t in seconds.items())
             / sum((k - mean_k) ** 2 for k in seconds))
    per_token = max(0.0, slope)  # timing noise must not make tokens free of charge
    return max(mean_t - mean_k * per_token, 1e-9), per_token


def decode_step_seconds(llm, requests: list[dict], params, batch: int, steps: int) -> tuple[float, float]:
    """Median seconds of `steps` decode steps with `batch` requests running together (the
    requests cycled to fill the batch), and the median of the drafter's own seconds in them
    (0 when the drafter is not timed: engine_stats.time_drafting); the requests are aborted
    afterwards."""
    from ..engine_stats import drafting_seconds

    engine = llm.llm_engine
    ids = [f"tune-{batch}-{i}-{time.monotonic_ns()}" for i in range(batch)]
    for rid, request in zip(ids, itertools.cycle(requests)):
        engine.add_request(rid, request, params)
    started: set[str] = set()
    timed: list[tuple[float, float]] = []
    try:
        while len(timed) < steps + WARMUP_STEPS:
            if engine.get_num_unfinished_requests() < batch:
                raise RuntimeError(f"a request finished after {len(timed)} of {steps} timed steps at batch "
                                   f"{batch}: raise max_tokens")
            drafting_seconds(llm)  # forget what earlier steps drafted
            t = time.perf_counter()
            outputs = engine.step()
            seconds = time.perf_counter() - t
            if len(started) == batch:
                timed.append((seconds, sum(drafting_seconds(llm))))
            started |= {o.request_id for o in outputs if o.outputs and o.outputs[0].token_ids}
    finally:
        engine.abort_request(ids)
        while engine.has_unfinished_requests():
            engine.step()
    kept = timed[WARMUP_STEPS:]
    return _median([t for t, _ in kept]), _median([d for _, d in kept])  # a delayed step does not count


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def measure_step_costs(open_engine, requests: list[dict], params, batch_sizes: list[int], depths: tuple[int, ...],
                       steps: int, progress=print, rounds: int = 2) -> list[StepCost]:
    """StepCost per batch size: open_engine(depth) gives an LLM serving the draft at `depth`
    (closed here when done); each batch size decodes `steps` timed steps at each depth, in each
    of `rounds` engine starts per depth (the order of depths reversed every other round), the
    drafter's own time kept beside each (the fastest start's)."""
    from ..engine_stats import time_drafting

    costs = {b: StepCost(b) for b in batch_sizes}
    draft_rounds: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for r in range(rounds):
        for depth in depths if r % 2 == 0 else depths[::-1]:
            llm = open_engine(depth)
            try:
                time_drafting(llm)
                # Untimed: an engine's first batches allocate and warm caches, and WARMUP_STEPS inside
                # one batch did not cover that (the hard world's draft timed batch 1 slower than 4).
                decode_step_seconds(llm, requests, params, max(batch_sizes), 1)
                for b in batch_sizes:
                    seconds, drafting = decode_step_seconds(llm, requests, params, b, steps)
                    costs[b].rounds.setdefault(depth, []).append(seconds)
                    draft_rounds.setdefault((b, depth), []).append((seconds, drafting))
                    progress(f"round {r + 1}, depth {depth}, batch {b}: {1e3 * seconds:.1f} ms per decode step, "
                             f"{1e3 * drafting:.1f} ms of it drafting")
            finally:
                llm.llm_engine.engine_core.shutdown()
    for cost in costs.values():
        cost.seconds = {depth: min(times) for depth, times in cost.rounds.items()}
        cost.draft_seconds = {depth: min(draft_rounds[cost.batch, depth])[1] for depth in cost.rounds}
    return [costs[b] for b in batch_sizes]


def describe(costs: list[StepCost]) -> list[dict[str, Any]]:
    """JSON-friendly rows: batch, ms per step and of it drafting at each depth, fixed and per-token ms,
    relative costs (per drafted-and-verified token, and its draft and verify shares), and the line's
    worst miss at a timed depth."""
    rows = []
    for c in costs:
        fixed, per_token = c.line()
        rows.append({"batch": c.batch, "ms_per_step": {str(k): round(1e3 * s, 3) for k, s in sorted(c.seconds.items())},
                     "ms_per_step_rounds": {str(k): [round(1e3 * s, 3) for s in v] for k, v in sorted(c.rounds.items())},
                     "draft_ms_per_step": {str(k): round(1e3 * s, 3) for k, s in sorted(c.draft_seconds.items())},
                     "fixed_ms": round(1e3 * fixed, 3), "per_token_ms": round(1e3 * per_token, 3),
                     "per_token_cost": round(c.per_token, 4), "draft_token_cost": round(c.draft_token, 4),
                     "verify_token_cost": round(c.verify_token, 4), "line_miss": round(c.line_miss, 4)})
    return rows
