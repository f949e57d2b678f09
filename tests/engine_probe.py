"""Looking into a running in-process vLLM engine from tests: the product's counters and drafter
accounting (vllm_sparrow.engine_stats), plus the drafter's recorded inputs."""

from __future__ import annotations


from vllm_sparrow.engine_stats import drafter_stats, spec_counters

__all__ = ["drafter_inputs", "drafter_stats", "record_drafter_inputs", "spec_counters", "text_entries_by_request"]


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
