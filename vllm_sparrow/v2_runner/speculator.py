"""Sparrow as vLLM 0.34's speculator (Model Runner V2): the runner's step in, draft token ids out.

A `DraftModelSpeculator`, for the one thing that class has that the bare interface lacks: the
runner calls its load_model with the target model, whose embedding and LM head the draft shares.
Its draft is no vLLM model: it registers no vLLM attention layer, so the runner allocates no
draft KV cache and builds no attention metadata for it; the drafter owns its text-only window
cache (serving_draft.py loads the draft exactly as the V1 runner's proposer does). Each step is
translated into a StepBatch without reading the device (step_inputs.py).

Lifecycle, as the runner drives it:
  add_request(slot)       a request joined: its prompt's visual spans were recorded as
                          RequestState.add_request ran (this glue wraps it on the runner's own
                          object); a request that left the runner without finishing (preempted:
                          0.34 tells the speculator nothing) is released here; one that is back
                          restarts its text stream through the drafter's restart path
  propose(...)            commit the step's target states, draft the step's depth: the
                          num_speculative_tokens the runner passes (its per-batch-size
                          schedule), K when it passes none, nothing at 0 (commit only)
  on_requests_finished    finished and aborted requests: their slots freed
  reset_state             after vLLM's warm-up requests: every slot freed
Sampled requests draft from q = softmax(draft logits / T) when vLLM keeps draft logits for
probabilistic verification (draft_sample_method "probabilistic"): the draft logits are rounded into
the runner's DraftLogitsCache row of the request first and the token is drawn from softmax(stored /
T), the q the rejection sampler recomputes (draft_logits.py, LogitRows); otherwise drafts are
greedy and verified one-hot, which is exact too. With adaptive verification
(`enable_adaptive_verification`), every drafted position's confidence is written for the runner's
budget (confidences.py). What the glue relies on in vLLM is declared in vllm_reads.py, checked
before the method registers.
"""

from __future__ import annotations

import torch
from vllm.v1.worker.gpu.spec_decode.acceptance_estimator import OnlineAcceptanceEstimator
from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator

from .. import envs
from ..drafting.noise import RequestNoise
from ..drafting.sampling import greedy
from ..serving_draft import ServingDraft, load_serving_draft
from .confidences import ConfidenceRecorder, start_from_draft_probabilities
from .draft_logits import LogitRows
from .step_inputs import step_batch


class SparrowSpeculator(DraftModelSpeculator):
    def __init__(self, vllm_config, device, req_states=None):
        super().__init__(vllm_config, device)
        if req_states is None:
            raise RuntimeError("vllm-sparrow's V2 speculator needs the runner's request states "
                               "(vLLM 0.34 passes them to a speculator whose constructor takes req_states)")
        self.req_states = req_states
        self.options = envs.parse_options(self.speculative_config.speculator_options)
        self.served: ServingDraft | None = None
        self._watch_new_requests(req_states)

    def _watch_new_requests(self, req_states) -> None:
        """Record each new request's prompt layout as the runner adds it to its request states
        (the token ids are on the host only there), on the runner's own object, not the class."""
        add = req_states.add_request

        def add_request(req_id, prompt_len, all_token_ids, num_computed_tokens, max_tokens):
            add(req_id, prompt_len, all_token_ids, num_computed_tokens, max_tokens)
            if self.served is not None:
                self.served.layouts.record(req_id, prompt_len, all_token_ids)

        req_states.add_request = add_request

    # ---- set-up called by the runner ----------------------------------------------------------
    def load_draft_model(self, target_model: torch.nn.Module, target_attn_layer_names: set[str]) -> torch.nn.Module:
        self.recorder = self._confidence_recorder()  # None: no runner reads confidences
        self.greedy = self.recorder or greedy  # the decode steps' greedy sampler (what the graphs replay)
        with envs.engine_options(self.options):
            self.served = load_serving_draft(self.vllm_config, self.speculative_config.model, target_model,
                                             self.device, self.dtype, self.num_speculative_steps,
                                             self.max_model_len, per_request_lengths=False, sample=self.greedy,
                                             glue=self._glue_line())
        return self.served.model

    def _glue_line(self) -> str:
        """For the load line: the glue, and what adaptive verification reads from it."""
        from vllm import __version__

        line = f"V2 runner glue on vLLM {__version__}'s registry, nothing patched"
        if self.recorder is not None:
            line += ("; adaptive verification on: every drafted position's confidence written through "
                     "vLLM's acceptance estimator, started from the draft's own probabilities")
        return line

    def _confidence_recorder(self) -> ConfidenceRecorder | None:
        """With adaptive verification, the sampler wrapper that writes each position's confidence
        first (confidences.py). Its estimator is made here, before the draft's CUDA graphs that
        record into it are captured, in place of the one the base class would make after this
        method returns."""
        if not self.use_acceptance_estimator:
            return None
        self.acceptance_estimator = OnlineAcceptanceEstimator(self.max_num_reqs, self.num_speculative_steps,
                                                              self.device)
        start_from_draft_probabilities(self.acceptance_estimator)
        self.use_acceptance_estimator = False  # the base class's load_model would replace it
        return ConfidenceRecorder(self.acceptance_estimator, self.idx_mapping, self.temperature,
                                  self.draft_token_confidence_probs)

    def init_cudagraph_manager(self, cudagraph_mode) -> None:
        pass  # the decode step's graphs are the drafter's own (drafting/graphs.py), captured at load

    def capture(self) -> None:
        pass  # the decode step's graphs were captured when the draft loaded (serving_draft.py)

    @property
    def sparrow_core(self):
        """The drafter this speculator drafts with (measurement tools: engine_stats.py)."""
        return self.served.drafter

    def sparrow_stats(self) -> dict:
        """The served draft's accounting (ServingDraft.stats; engine_stats.drafter_stats reads it)."""
        return self.served.stats()

    # ---- requests ---------------------------------------------------------------------------------
    def add_request(self, req_index: int) -> None:  # req_index: the newcomer's slot (its layout is recorded)
        # A request that left the runner without finishing (preempted: 0.34 says nothing) gives its
        # slot back before the newcomer takes one. One back already (resumed, or its input streamed
        # in) keeps its slot: its rows restart at an earlier position, which the drafter takes as
        # a restart of its text stream (drafter.py, `fresh`).
        live = self.req_states.req_id_to_index
        gone = [r for r in self.served.drafter.tracked() if r not in live]
        if gone:
            self.served.release(gone)  # its layout is recorded again if it comes back (RequestState.add_request)

    def on_requests_finished(self, finished_req_ids: set[str]) -> None:
        self.served.release(finished_req_ids)

    def reset_state(self) -> None:
        self.served.release_all()

    # ---- one step ---------------------------------------------------------------------------------
    def propose(self, input_batch, attn_metadata, slot_mappings, last_hidden_states, aux_hidden_states,
                num_sampled, num_rejected, last_sampled, next_prefill_tokens, temperature, seeds,
                dp_sync_state=None, dummy_run=False, skip_attn_for_dummy_run=False, mm_inputs=None,
                is_profile=False, num_speculative_tokens=None) -> torch.Tensor:  # [num_reqs, K]
        n = input_batch.num_reqs
        # The step's depth: the runner's schedule (num_speculative_tokens_per_batch_size) picks it
        # per step and masks the columns past it; drafting them would cost K forwards for k tokens.
        K = self.num_speculative_steps if num_speculative_tokens is None else num_speculative_tokens
        out = self.draft_tokens[:n]  # [B, num_speculative_steps]; columns K.. are the runner's to mask
        drafter = self.served.drafter
        if dummy_run:
            if is_profile:  # vLLM's memory profile: the draft's largest step is in its peak
                self.served.profile(input_batch.num_tokens, self.max_num_reqs, self.num_speculative_steps,
                                    self._profile_store())
            return out.zero_()
        batch = step_batch(drafter, self.served.layouts, input_batch, self.req_states.prompt_len.np, last_hidden_states,
                           num_sampled, num_rejected, last_sampled, next_prefill_tokens)
        if K == 0:  # no drafts scheduled: the step's states still go in
            with torch.inference_mode():
                drafter.commit(batch, 0)
            return out.zero_()
        slots = input_batch.idx_mapping[:n]  # [B] request-state slot of each batch row
        if self.recorder is not None:  # the confidences' inputs, in the buffers the recorder reads
            self.idx_mapping[:n].copy_(slots)
            self.idx_mapping[n:].fill_(-1)
            self.temperature.copy_(temperature)
        sample = self.greedy if self.draft_logits is None else self._sampled(temperature[slots], slots, seeds[slots], batch)
        out[:, :K].copy_(self.served.step(batch, K, sample).ids)
        return out

    def _sampled(self, temp: torch.Tensor, slots: torch.Tensor, seeds: torch.Tensor, batch):
        """The sampled draft of a step (temp, seeds [B] by batch row, vLLM's are by slot), its
        noise keyed by each request's seed and position (vLLM gives every request a seed: a
        seeded request's drafts, and so its output, repeat), behind the confidence recorder when
        the runner reads confidences."""
        noise = RequestNoise(seeds, batch.seq_start + batch.num_valid)  # [B] each one's next position
        store = LogitRows(self.draft_logits.values, slots, self.served.drafter.vocab_ids)
        sample = self.served.sampled(temp, store, noise)
        return sample if self.recorder is None else self.recorder.around(sample)

    def _profile_store(self) -> LogitRows | None:
        """Where the profile's step keeps q: every request sampled when vLLM keeps draft logits
        (the profile's requests write the cache's first rows: nothing reads them before the first
        real step)."""
        if self.draft_logits is None:
            return None
        rows = torch.arange(self.max_num_reqs, device=self.device) % self.draft_logits.values.shape[0]
        return LogitRows(self.draft_logits.values, rows, self.served.drafter.vocab_ids)
