"""What one more drafted token costs on this machine, measured in vLLM (`sparrow tune`).

The depth rule (depth.py) needs, per batch size, the cost of a step that drafts k tokens:

    step(k) = fixed + k x per_token    (fixed: the verify step without drafts; per_token: one
                                        more draft forward plus one more verified token)

Both change with the hardware and the batch: on a GPU at batch 1 a 7B verify step is bound by
reading its weights, so verifying 9 tokens costs about what verifying 1 does; at batch 64 it is
bound by compute and every verified token counts. So they are measured, not assumed: the real
engine serves the draft at two depths, `batch` requests decode together, and the median time of
their decode steps at each depth gives the line through the two points.

A decode step is one `LLMEngine.step()` after every request of the batch has its first token
(so no prefill is inside) while all of them still run (max_tokens keeps them running); the
first `WARMUP_STEPS` are not timed (first-call allocations).

Each depth's engine is started `rounds` times, the depths alternating (1, 8, 8, 1, ...), and a
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

    def line(self) -> tuple[float, float]:
        """(fixed, per_token) seconds through the shallowest and deepest measured depths."""
        (k1, t1), (k2, t2) = min(self.seconds.items()), max(self.seconds.items())
        if k1 == k2:
            raise ValueError(f"batch {self.batch}: two depths are needed, measured {sorted(self.seconds)}")
        per_token = max(0.0, (t2 - t1) / (k2 - k1))  # timing noise must not make tokens free of charge
        return max(t1 - k1 * per_token, 1e-9), per_token

    @property
    def per_token(self) -> float:
        """One more drafted-and-verified token, relative to the step's fixed cost."""
        fixed, per_token = self.line()
        return per_token / fixed


def decode_step_seconds(llm, requests: list[dict], params, batch: int, steps: int) -> float:
    """Median seconds of `steps` decode steps with `batch` requests running together (the
    requests cycled to fill the batch); the requests are aborted afterwards."""
    engine = llm.llm_engine
    ids = [f"tune-{batch}-{i}-{time.monotonic_ns()}" for i in range(batch)]
    for rid, request in zip(ids, itertools.cycle(requests)):
        engine.add_request(rid, request, params)
    started: set[str] = set()
    timed: list[float] = []
    try:
        while len(timed) < steps + WARMUP_STEPS:
            if engine.get_num_unfinished_requests() < batch:
                raise RuntimeError(f"a request finished after {len(timed)} of {steps} timed steps at batch "
                                   f"{batch}: raise max_tokens")
            t = time.perf_counter()
            outputs = engine.step()
            seconds = time.perf_counter() - t
            if len(started) == batch:
                timed.append(seconds)
            started |= {o.request_id for o in outputs if o.outputs and o.outputs[0].token_ids}
    finally:
        engine.abort_request(ids)
        while engine.has_unfinished_requests():
            engine.step()
    kept = sorted(timed[WARMUP_STEPS:])
    return kept[len(kept) // 2]  # the median: a step the OS or another process delayed does not count


def measure_step_costs(open_engine, requests: list[dict], params, batch_sizes: list[int], depths: tuple[int, int],
                       steps: int, progress=print, rounds: int = 2) -> list[StepCost]:
    """StepCost per batch size: open_engine(depth) gives an LLM serving the draft at `depth`
    (closed here when done); each batch size decodes `steps` timed steps at each depth, in each
    of `rounds` engine starts per depth (the order of depths reversed every other round)."""
    costs = {b: StepCost(b) for b in batch_sizes}
    for r in range(rounds):
        for depth in depths if r % 2 == 0 else depths[::-1]:
            llm = open_engine(depth)
            try:
                # Untimed: an engine's first batches allocate and warm caches, and WARMUP_STEPS inside
                # one batch did not cover that (the hard world's draft timed batch 1 slower than 4).
                decode_step_seconds(llm, requests, params, max(batch_sizes), 1)
                for b in batch_sizes:
                    seconds = decode_step_seconds(llm, requests, params, b, steps)
                    costs[b].rounds.setdefault(depth, []).append(seconds)
                    progress(f"round {r + 1}, depth {depth}, batch {b}: {1e3 * seconds:.1f} ms per decode step")
            finally:
                llm.llm_engine.engine_core.shutdown()
    for cost in costs.values():
        cost.seconds = {depth: min(times) for depth, times in cost.rounds.items()}
    return [costs[b] for b in batch_sizes]


def describe(costs: list[StepCost]) -> list[dict[str, Any]]:
    """JSON-friendly rows: batch, ms per step at each depth, fixed and per-token ms, relative cost."""
    rows = []
    for c in costs:
        fixed, per_token = c.line()
        rows.append({"batch": c.batch, "ms_per_step": {str(k): round(1e3 * s, 3) for k, s in sorted(c.seconds.items())},
                     "ms_per_step_rounds": {str(k): [round(1e3 * s, 3) for s in v] for k, v in sorted(c.rounds.items())},
                     "fixed_ms": round(1e3 * fixed, 3), "per_token_ms": round(1e3 * per_token, 3),
                     "per_token_cost": round(c.per_token, 4)})
    return rows
