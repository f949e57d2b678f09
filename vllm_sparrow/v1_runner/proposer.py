"""The vLLM-facing proposer: target hidden states in, draft token ids out.

A V1 `EagleProposer` subclass (the runner type-checks its drafter against EagleProposer), built
by method_patches.py for method "sparrow". It replaces the EAGLE data path: vLLM allocates no draft
KV cache and never feeds visual embeddings to the draft; each step is translated into a
`StepBatch` and handed to `SparrowDrafter`, which owns the text-only window cache (allocated
once at load time, sized by max_num_seqs, refused with a message when it cannot fit), with the
drafting strategy chosen at load (drafting/choice.py), as serving_draft.py loads them for either
runner. What it reads from the runner and from the EagleProposer base, and the methods it
overrides, are rows of vllm_reads.py, checked at start-up.
"""

from __future__ import annotations

import numpy as np
import torch
from vllm.v1.spec_decode.eagle import EagleProposer

from ..drafter import SparrowDrafter
from ..drafting.noise import RequestNoise
from ..drafting.sampling import Sampler, greedy
from ..drafting.step import StepBatch
from ..patch_helper import APPLIED
from ..serving_draft import ServingDraft, load_serving_draft, logger
from .q_buffer import QBuffer


class SparrowProposer(EagleProposer):
    def __init__(self, vllm_config, device, runner=None):
        super().__init__(vllm_config, device, runner)
        self.runner = runner
        # Visual embeddings never reach the draft (the runner then skips gathering them).
        self.supports_mm_inputs = False
        # (`drafter` is what vLLM's runner calls this proposer; the Sparrow draft it serves is ours.)
        self.served: ServingDraft | None = None

    # ---- set-up called by the runner ----------------------------------------------
    def load_model(self, target_model: torch.nn.Module) -> None:
        served = load_serving_draft(self.vllm_config, self.speculative_config.model, target_model, self.device,
                                    self.dtype, self.num_speculative_tokens, self.max_model_len,
                                    glue=f"V1 runner glue, {len(APPLIED)} vLLM patches applied: {', '.join(APPLIED)}")
        # Kept off `self.model`: the runner wraps a drafter's `.model` in CUDA-graph wrappers.
        self.served = served
        self.q_buffer = self._q_buffer()

    def _q_buffer(self) -> QBuffer | None:
        """With probabilistic drafting, the [max_num_seqs, K, vocab] float32 buffer q is kept in
        for this runner's rejection sampler, allocated now, before vLLM profiles memory, so its KV
        cache is sized around it (drafting/sampling.py)."""
        if not self._enable_probabilistic_draft_probs:
            return None
        seqs, vocab = self.vllm_config.scheduler_config.max_num_seqs, self.vllm_config.model_config.get_vocab_size()
        size = QBuffer.bytes_needed(seqs, self.num_speculative_tokens, vocab)
        logger.info("Sparrow: probabilistic drafting keeps each step's draft distributions in %.2f GiB "
                    "([%d, %d, %d] float32: max_num_seqs x draft tokens x vocabulary), allocated before vLLM "
                    "profiles memory; greedy drafts (the default) need none and are exact at any temperature",
                    size / 2**30, seqs, self.num_speculative_tokens, vocab)
        return QBuffer(seqs, self.num_speculative_tokens, vocab, self.device, self.served.drafter.vocab_ids)

    def initialize_attn_backend(self, kv_cache_config, kernel_block_sizes=None) -> None:
        # No vLLM attention layers and no vLLM KV cache for the draft. Group 0's metadata
        # (query_start_loc, seq_lens) is all the runner needs to hand us.
        self.kv_cache_gid = 0
        self.draft_attn_groups = []

    def initialize_cudagraph_keys(self, cudagraph_mode) -> None:
        pass  # vLLM's graph wrappers are not used: drafting/graphs.py captures the decode step itself

    def validate_same_kv_cache_group(self, kv_cache_config) -> None:
        pass

    def dummy_run(self, num_tokens: int, *args, is_graph_capturing: bool = False, **kwargs) -> None:
        # The cache, the q buffer and the decode step's CUDA graphs are made at load time, before
        # vLLM profiles memory (serving_draft.py); at vLLM's graph capture nothing is left to do.
        # Otherwise (vLLM's memory profile among them) the largest step of num_tokens rows runs,
        # drafted as the engine drafts, so the draft's activations are in the peak vLLM budgets for.
        if self.served is None or is_graph_capturing:
            return
        max_seqs = self.vllm_config.scheduler_config.max_num_seqs
        rows = self.served.profile(num_tokens, max_seqs, self.num_speculative_tokens, self.q_buffer)
        self.profiled_rows = max(getattr(self, "profiled_rows", 0), rows)

    def release_requests(self, req_ids) -> None:
        if self.served is not None:
            self.served.release(req_ids)

    @property
    def sparrow_core(self) -> SparrowDrafter:
        """The drafter this proposer drafts with (measurement tools: engine_stats.py)."""
        return self.served.drafter

    def sparrow_stats(self) -> dict:
        """The served draft's accounting (ServingDraft.stats; engine_stats.drafter_stats reads it)."""
        return self.served.stats()

    # ---- one step ------------------------------------------------------------------
    def propose(
        self,
        num_speculative_tokens,
        target_token_ids: torch.Tensor,  # [num_tokens]
        target_positions: torch.Tensor,  # [num_tokens] or [3, num_tokens]; unused: text indices instead
        target_hidden_states: torch.Tensor,  # [num_tokens, hidden]
        next_token_ids: torch.Tensor,  # [batch]
        token_indices_to_sample,
        common_attn_metadata,
        sampling_metadata,
        mm_embed_inputs=None,
        num_rejected_tokens_gpu: torch.Tensor | None = None,  # [batch], padded-batch mode
        slot_mappings=None,
    ) -> torch.Tensor:  # [batch, num_speculative_tokens]
        assert self.served is not None, "load_model() was not called"
        batch = self._step_batch(
            target_token_ids, target_hidden_states, next_token_ids,
            common_attn_metadata, num_rejected_tokens_gpu,
        )
        drafts = self.served.step(batch, num_speculative_tokens, self._sampler(sampling_metadata, batch))
        self._last_draft_probs = drafts.probs  # a view of q_buffer (sampled steps), else None
        # Adaptive length: vLLM's scheduler schedules exactly each request's kept drafts to verify
        # (read back to the host, as vLLM's non-async path does anyway).
        kept = self.served.drafting.per_request(drafts)
        return drafts.ids if kept is None else kept

    def _step_batch(self, token_ids, hidden, next_token_ids, cm, num_rejected) -> StepBatch:
        """The engine step as the drafter sees it, without reading anything back from the
        device: per-request counts come from the runner's host arrays or stay on the device."""
        n = cm.num_reqs
        qsl = cm.query_start_loc[: n + 1]  # [B + 1] device
        query_lens = qsl[1:] - qsl[:-1]  # [B]
        num_valid = query_lens - num_rejected[:n] if num_rejected is not None else query_lens
        batch = self.runner.input_batch
        req_ids = list(batch.req_ids[:n])
        prompt = batch.num_prompt_tokens[:n].astype(np.int64)  # [B] host
        layouts = self.served.layouts
        for i, r in enumerate(req_ids):  # a request new to the glue: its prompt's layout, once
            if r not in layouts.by_request:
                layouts.record(r, int(prompt[i]), batch.token_ids_cpu[i])
        # Tokens computed before this step (exact while any prompt remains: only draft tokens make
        # the runner's count optimistic), so >= prompt length means no row of the step is a prompt
        # position: every request decodes, and the drafter takes its fixed-shape path.
        computed = batch.num_computed_tokens_cpu[:n].astype(np.int64)
        decoding = bool((computed >= prompt).all())
        query_start = cm.query_start_loc_cpu[: n + 1].numpy().astype(np.int64)
        qlen = np.diff(query_start)
        return StepBatch(
            req_ids=req_ids,
            token_ids=token_ids.long(),
            hidden=hidden,
            query_start=query_start,
            num_valid=num_valid.long(),
            seq_start=(cm.seq_lens[:n] - query_lens).long(),
            num_prompt_tokens=self.served.drafter.to_device(torch.from_numpy(prompt)),
            next_token=next_token_ids[:n].long(),
            mid_prefill=self.runner.discard_request_mask.gpu[:n],
            decode_only=decoding,
            text_bound=layouts.text_bound(req_ids, computed + qlen, prompt),
            text_rows=None if decoding else layouts.text_rows(req_ids, computed, qlen, prompt),
        )

    def _sampler(self, md, batch: StepBatch) -> Sampler:
        if self.q_buffer is None or md.all_greedy:
            return greedy
        return self.served.sampled(md.temperature, self.q_buffer, self._seeded_noise(md, batch))

    def _seeded_noise(self, md, batch: StepBatch) -> RequestNoise | None:
        """Noise keyed by seed and position when a request of the step has a seed (vLLM 0.32 keeps
        a generator, seeded with it, per such request: md.generators by batch row), so its drafts
        and output repeat; the other rows get seeds drawn from the engine's stream. None (the
        engine's stream for all) when no request has one."""
        if not md.generators:
            return None
        generator = self.served.generator  # on the draft's device
        seeds = torch.randint(0, 2**62, (batch.num_valid.shape[0],), generator=generator, device=generator.device)  # [B]
        rows = list(md.generators)
        seeds[rows] = torch.tensor([md.generators[r].initial_seed() for r in rows], device=seeds.device)
        return RequestNoise(seeds, batch.seq_start + batch.num_valid)
