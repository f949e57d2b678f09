"""What a running vLLM engine says about speculation: vLLM's spec-decode counters and
the Sparrow drafter's own accounting (batch captioning, the benchmark, the demo and the tests
read them here)."""

from __future__ import annotations

from typing import Any


def spec_counters(llm) -> dict[str, Any]:
    """vLLM's spec-decode counters (cumulative): num_drafts, num_draft_tokens,
    num_accepted_tokens, per_pos (accepted tokens at each draft position). Zeros when the
    engine keeps no stats (disable_log_stats)."""
    out: dict[str, Any] = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "per_pos": []}
    try:
        metrics = llm.get_metrics()
    except Exception:  # noqa: BLE001 - stats disabled on this engine
        return out
    for m in metrics:
        name = m.name.removeprefix("vllm:spec_decode_")
        if name in out and name != "per_pos":
            out[name] = int(m.value)
        elif name == "num_accepted_tokens_per_pos":
            out["per_pos"] = [int(v) for v in m.values]
    return out


def _glue(worker):
    """The worker's Sparrow glue: the V1 runner's proposer (vLLM 0.32, 0.33) or the V2 runner's
    speculator (0.34); None when the engine does not draft with sparrow."""
    runner = worker.model_runner
    glue = getattr(runner, "drafter", None) or getattr(runner, "speculator", None)
    return glue if hasattr(glue, "sparrow_stats") else None


def _drafter_stats(worker) -> dict:
    glue = _glue(worker)
    return glue.sparrow_stats() if glue is not None else {}


def _time_drafting(worker) -> bool:
    """Wrap the worker's drafter so each step's drafting time (commit and draft, device work
    included: synchronised on CUDA) is kept in its `seconds_per_step` list."""
    import time

    import torch

    glue = _glue(worker)
    if glue is None:
        return False
    served = glue.served  # each step goes through the served draft (serving_draft.py), either glue
    drafter = served.drafter
    if getattr(drafter, "seconds_per_step", None) is not None:
        return True
    cuda = drafter.device.type == "cuda"
    step, commit = served.step, drafter.commit
    drafter.seconds_per_step = []
    inside = [False]  # a step's own commit is part of the step: timed once, from the outside

    def timed(fn):
        def run(*args, **kwargs):
            if inside[0]:
                return fn(*args, **kwargs)
            inside[0] = True
            try:
                if cuda:
                    torch.cuda.synchronize(drafter.device)
                t = time.perf_counter()
                out = fn(*args, **kwargs)
                if cuda:
                    torch.cuda.synchronize(drafter.device)
                drafter.seconds_per_step.append(time.perf_counter() - t)
                return out
            finally:
                inside[0] = False
        return run

    served.step, drafter.commit = timed(step), timed(commit)  # commit alone: a step with no drafts (0.34)
    return True


def _drafting_seconds(worker) -> list[float]:
    glue = _glue(worker)
    seconds = getattr(glue.sparrow_core, "seconds_per_step", None) if glue is not None else None
    if not seconds:
        return []
    taken = list(seconds)
    seconds.clear()
    return taken


class StatsWorkerExtension:
    """Mixed into vLLM's worker (the engine argument worker_extension_cls=EXTENSION) by engines
    whose engine core runs in another process (vLLM's default): there LLM.collective_rpc sends
    method names, not functions (a function does not serialise without vLLM's insecure pickle
    fallback), so each reading is also a worker method."""

    def sparrow_time_drafting(self) -> bool:
        return _time_drafting(self)

    def sparrow_drafting_seconds(self) -> list[float]:
        return _drafting_seconds(self)

    def sparrow_drafter_stats(self) -> dict:
        return _drafter_stats(self)


EXTENSION = f"{__name__}.StatsWorkerExtension"


def _on_worker(llm, fn):
    """fn(worker) on the (first) worker: the function itself where the engine core is in this
    process; by its StatsWorkerExtension method's name where the engine refuses to serialise a
    function (the encoder raises before anything is sent, so nothing runs twice)."""
    try:
        return llm.collective_rpc(fn)[0]
    except TypeError as e:
        if "serializ" not in str(e):
            raise
        try:
            return llm.collective_rpc("sparrow" + fn.__name__)[0]
        except AttributeError as missing:
            raise RuntimeError(f"this engine runs its core in another process: open it with "
                               f"worker_extension_cls={EXTENSION!r} to read the drafter's stats") from missing


def time_drafting(llm) -> bool:
    """From now on keep the time of every draft step the engine's drafter runs (measurement runs:
    `sparrow tune`, the benchmark); False when the engine does not draft with sparrow."""
    return bool(_on_worker(llm, _time_drafting))


def drafting_seconds(llm) -> list[float]:
    """Seconds of each draft step since time_drafting(llm) or the last call, in order (one per
    engine step that drafted); the worker forgets them."""
    return _on_worker(llm, _drafting_seconds)


def drafter_stats(llm) -> dict[str, Any]:
    """sparrow_stats() of the (first) worker's Sparrow glue (the drafter's accounting and the
    drafting strategy), through LLM.collective_rpc; {} when the engine does not draft with sparrow."""
    return _on_worker(llm, _drafter_stats)
