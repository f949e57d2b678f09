"""What a running in-process vLLM engine says about speculation: vLLM's spec-decode counters and
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


def _drafter_stats(worker) -> dict:
    runner = worker.model_runner
    # the V1 runner's proposer (vLLM 0.32, 0.33) or the V2 runner's speculator (0.34)
    glue = getattr(runner, "drafter", None) or getattr(runner, "speculator", None)
    stats = getattr(glue, "sparrow_stats", None)
    return stats() if stats is not None else {}


def drafter_stats(llm) -> dict[str, Any]:
    """sparrow_stats() of the (first) worker's Sparrow glue (the drafter's accounting and the
    drafting strategy), through LLM.collective_rpc; {} when the engine does not draft with sparrow."""
    return llm.collective_rpc(_drafter_stats)[0]
