"""Looking into a running in-process vLLM engine from tests: the product's counters and drafter
accounting (vllm_sparrow.engine_stats), plus a record of every step the drafter is handed and
what it drafts."""

from __future__ import annotations


from vllm_sparrow.engine_stats import drafter_stats, spec_counters

__all__ = ["drafter_inputs", "drafter_stats", "record_drafter_inputs", "spec_counters", "text_entries_by_request"]


def text_entries_by_request(llm) -> dict[str, int]:
    """Text entries each request committed to the draft cache, keyed by the caller's request id.

    The engine core suffixes request ids ("<id>-<random>"); strip that suffix.
    """
    entries = drafter_stats(llm)["text_entries"]
    return {key.rsplit("-", 1)[0]: value for key, value in entries.items()}


class _RecordingIO:
    """The drafter's token I/O, keeping every [B, vocab] logits tensor of the current step."""

    def __init__(self, inner, sink: list) -> None:
        self.inner, self.sink = inner, sink

    def embed(self, token_ids):
        return self.inner.embed(token_ids)

    def logits(self, hidden):
        out = self.inner.logits(hidden)
        self.sink.append(out.float().cpu().clone())
        return out

    def __getattr__(self, name):  # a reduced vocabulary's ids / vocab_size
        return getattr(self.inner, name)


def _record_on(worker) -> None:
    served = worker.model_runner.drafter.served  # every step goes through the served draft (serving_draft.py)
    drafter = served.drafter
    if getattr(drafter, "recorded", None) is None:
        drafter.recorded, logits = [], []
        drafter.io = _RecordingIO(drafter.io, logits)
        original = served.step

        def step(batch, num_draft, sample):
            logits.clear()
            drafts = original(batch, num_draft, sample)
            ids, probs = drafts.ids, drafts.probs
            B = len(batch.req_ids)
            drafter.recorded.append({
                "req_ids": list(batch.req_ids), "token_ids": batch.token_ids.cpu().clone(),
                "hidden": batch.hidden.float().cpu().clone(),
                "row_start": batch.query_start[:-1].tolist(),
                "num_valid": batch.num_valid.tolist(), "seq_start": batch.seq_start.tolist(),
                "next_token": batch.next_token.tolist(), "mid_prefill": batch.mid_prefill.tolist(),
                "text_bound": None if batch.text_bound is None else batch.text_bound.tolist(),
                "drafts": ids.tolist(), "probs": None if probs is None else probs.float().cpu().clone(),
                "logits": [x for x in logits if x.shape[0] == B]})
            return drafts

        served.step = step
    drafter.recorded.clear()


def _recorded(worker) -> list[dict]:
    return worker.model_runner.drafter.served.drafter.recorded


def record_drafter_inputs(llm) -> None:
    """From now on keep every step the SparrowDrafter receives, its draft ids, the draft logits
    of each chain step and (probabilistic drafting) the draft probabilities (tests only)."""
    llm.collective_rpc(_record_on)


def drafter_inputs(llm) -> list[dict]:
    """The recorded steps: token ids, target hidden states, rows per request, drafts, logits."""
    return llm.collective_rpc(_recorded)[0]
