"""What a drafter does with the depth vLLM's runner schedules for each step (both glues' tests of
it: test_drafting_follows_the_scheduled_depth*.py).

vLLM's num_speculative_tokens_per_batch_size picks each step's depth from the number of
scheduled requests; the runner passes it to the drafter and verifies only that many drafts. A
drafter that drafts its maximum anyway does K_max forwards for k tokens. Here the drafter's
step is wrapped in the engine (in-process) and each call's batch size, depth asked, aten ops
dispatched (OpCounter: a clock-free measure of drafting work) and seconds are kept.
"""

from __future__ import annotations

import statistics
import time

from conftest import TRAINED_TEXTS, close_llm, make_llm
from vllm import SamplingParams

from support.lossless_batch import MORE_TEXTS
from sparrow_world.bench.op_count import OpCounter
from sparrow_world.tiny_targets import make_prompt

KIND, MAX_DEPTH, BATCH = "llama", 8, 4
SCHEDULE = [[1, 1, MAX_DEPTH], [2, 16, 1]]  # depth 8 alone, depth 1 from two requests up
PARAMS = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def prompts(target) -> list[str]:
    return [make_prompt(KIND, target, t, None) for t in (TRAINED_TEXTS + MORE_TEXTS)[:BATCH]]


def _record_steps(worker) -> None:
    runner = worker.model_runner
    glue = getattr(runner, "drafter", None) or getattr(runner, "speculator", None)
    drafter, served = glue.sparrow_core, glue.served  # each step goes through the served draft (serving_draft.py)
    step, drafter.step_records = served.step, []

    def recorded(batch, num_draft, *args, **kwargs):
        with OpCounter() as ops:
            t = time.perf_counter()
            out = step(batch, num_draft, *args, **kwargs)
            seconds = time.perf_counter() - t
        drafter.step_records.append(dict(batch=len(batch.req_ids), depth=num_draft, decode=batch.decode_only,
                                         ops=ops.ops, seconds=seconds, drafted=int(out.ids.shape[1])))
        return out

    served.step = recorded


def _records(worker) -> list[dict]:
    runner = worker.model_runner
    glue = getattr(runner, "drafter", None) or getattr(runner, "speculator", None)
    return list(glue.sparrow_core.step_records)


def drafting_at(target, draft, speculative: dict) -> tuple[list[list[int]], list[dict]]:
    """Greedy outputs of the prompts alone and then as a batch of BATCH, and the drafter's step
    records of the batch's decode steps (every request decoding, all BATCH of them)."""
    llm = make_llm(target, max_num_seqs=BATCH, speculative_config={"method": "sparrow", "model": str(draft),
                                                                    **speculative})
    llm.collective_rpc(_record_steps)
    texts = prompts(target)
    alone = [list(llm.generate(texts[:1], PARAMS, use_tqdm=False)[0].outputs[0].token_ids)]
    batch = [list(o.outputs[0].token_ids) for o in llm.generate(texts, PARAMS, use_tqdm=False)]
    records = llm.collective_rpc(_records)[0]
    close_llm(llm)
    return alone + batch, records


def summary(records: list[dict], batch: int) -> dict:
    """The decode steps at this batch size: depths asked and drafted, median ops and seconds."""
    steps = [r for r in records if r["decode"] and r["batch"] == batch]
    return dict(steps=len(steps), depths={r["depth"] for r in steps}, drafted={r["drafted"] for r in steps},
                ops=statistics.median(r["ops"] for r in steps), ms=1e3 * statistics.median(r["seconds"] for r in steps))


def check_schedule_costs_what_it_drafts(target, draft) -> None:
    """The Done-when of the depth schedule: a batch-4 decode step under a schedule that gives depth
    1 at batch >= 2 (maximum 8) does at most 1.5x the drafting work of an engine at a fixed depth
    1 (aten ops, and the clock printed beside them), outputs equal to no speculation's; the same
    engine drafts 8 for one request alone."""
    base = make_llm(target, max_num_seqs=BATCH)
    texts = prompts(target)
    reference = [list(base.generate(texts[:1], PARAMS, use_tqdm=False)[0].outputs[0].token_ids)]
    reference += [list(o.outputs[0].token_ids) for o in base.generate(texts, PARAMS, use_tqdm=False)]
    close_llm(base)
    scheduled, rec_s = drafting_at(target, draft, {"num_speculative_tokens": MAX_DEPTH,
                                                   "num_speculative_tokens_per_batch_size": SCHEDULE})
    fixed, rec_f = drafting_at(target, draft, {"num_speculative_tokens": 1})
    assert scheduled == reference and fixed == reference
    s, f, alone = summary(rec_s, BATCH), summary(rec_f, BATCH), summary(rec_s, 1)
    print(f"batch {BATCH} decode steps: schedule (max {MAX_DEPTH}) {s}; fixed depth 1 {f}; batch 1 {alone}")
    assert s["steps"] >= 10 and f["steps"] >= 10, (s, f)
    assert s["depths"] == {1} and s["drafted"] == {1}, s  # what the runner scheduled, and no more
    assert alone["depths"] == {MAX_DEPTH} and alone["drafted"] == {MAX_DEPTH}, alone
    assert s["ops"] <= 1.5 * f["ops"], (s, f)
