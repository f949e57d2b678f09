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


def text_entries_by_request(llm) -> dict[str, int]:
    """Text entries each request committed to the draft cache, keyed by the caller's request id.

    The engine core suffixes request ids ("<id>-<random>"); strip that suffix.
    """
    entries = drafter_stats(llm)["text_entries"]
    return {key.rsplit("-", 1)[0]: value for key, value in entries.items()}


def _record_on(worker) -> None:
    drafter = worker.model_runner.drafter.drafter
    if getattr(drafter, "recorded", None) is None:
        drafter.recorded = []
        original = drafter.step

        def step(batch, num_draft, sample):
            drafter.recorded.append({
                "req_ids": list(batch.req_ids), "token_ids": batch.token_ids.cpu().clone(),
                "hidden": batch.hidden.float().cpu().clone(),
                "row_start": batch.query_start[:-1].tolist(),
                "num_valid": batch.num_valid.tolist(), "seq_start": batch.seq_start.tolist(),
                "text_bound": None if batch.text_bound is None else batch.text_bound.tolist()})
            return original(batch, num_draft, sample)

        drafter.step = step
    drafter.recorded.clear()


def _recorded(worker) -> list[dict]:
    return worker.model_runner.drafter.drafter.recorded


def record_drafter_inputs(llm) -> None:
    """From now on keep every StepBatch the SparrowDrafter receives (tests only)."""
    llm.collective_rpc(_record_on)


def drafter_inputs(llm) -> list[dict]:
    """The recorded StepBatches: token ids, target hidden states, rows per request."""
    return llm.collective_rpc(_recorded)[0]
