"""Looking into a running in-process vLLM engine from tests: spec-decode counters, drafter state."""

from __future__ import annotations

from typing import Any


def _drafter_stats(worker) -> dict:
    drafter = getattr(worker.model_runner, "drafter", None)
    inner = getattr(drafter, "drafter", None)
    return inner.stats() if inner is not None else {}


def drafter_stats(llm) -> dict[str, Any]:
    """SparrowDrafter.stats() of the (single) worker, through LLM.collective_rpc."""
    return llm.collective_rpc(_drafter_stats)[0]


def spec_counters(llm) -> dict[str, Any]:
    """vLLM's spec-decode counters: num_drafts, num_draft_tokens, num_accepted_tokens, per_pos."""
    out: dict[str, Any] = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "per_pos": []}
    for m in llm.get_metrics():
        name = m.name.removeprefix("vllm:spec_decode_")
        if name in out and name != "per_pos":
            out[name] = int(m.value)
        elif name == "num_accepted_tokens_per_pos":
            out["per_pos"] = [int(v) for v in m.values]
    return out


def peak_bytes_by_request(llm) -> dict[str, int]:
    """Peak draft-cache bytes per request, keyed by the caller's request id.

    The engine core suffixes request ids ("<id>-<random>"); strip that suffix.
    """
    peaks = drafter_stats(llm)["peak_request_bytes"]
    return {key.rsplit("-", 1)[0]: value for key, value in peaks.items()}
