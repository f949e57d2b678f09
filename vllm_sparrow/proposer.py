"""The vLLM-facing proposer: target hidden states in, draft token ids out.

A V1 `EagleProposer` subclass (the runner type-checks its drafter against EagleProposer), built
by patches.py for method "sparrow". It replaces the EAGLE data path: vLLM allocates no draft KV
cache and never feeds visual embeddings to the draft; each step is translated into a
`StepBatch` and handed to `SparrowDrafter`, which owns the text-only window cache.
"""

from __future__ import annotations


import torch
from vllm.v1.spec_decode.eagle import EagleProposer

from .attention import select_backend
from .checkpoint import load_draft
from .drafter import Sampler, SparrowDrafter, StepBatch
from .model import OwnTokenIO
from .targets import target_spec

from vllm.logger import init_logger

logger = init_logger("vllm_sparrow")
_SAMPLING_EPS = 1e-5  # vLLM's greedy threshold on temperature


class _TargetTokenIO:
    """The target's embedding and LM head (TP-aware, via the model's public interface)."""

    def __init__(self, target_model: torch.nn.Module) -> None:
        lm = target_model.get_language_model() if hasattr(target_model, "get_language_model") else target_model
        self._embed = lm.embed_input_ids
        self._logits = target_model.compute_logits

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self._embed(token_ids)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._logits(hidden)


class SparrowProposer(EagleProposer):
    def __init__(self, vllm_config, device, runner=None):
        super().__init__(vllm_config, device, runner)
        self.runner = runner
        # Visual embeddings never reach the draft (the runner then skips gathering them).
        self.supports_mm_inputs = False
        self.drafter: SparrowDrafter | None = None
        self.draft_generator = torch.Generator(device=device)
        self.draft_generator.manual_seed(vllm_config.model_config.seed or 0)

    # ---- set-up called by the runner ----------------------------------------------
    def load_model(self, target_model: torch.nn.Module) -> None:
        draft_dir = self.speculative_config.model
        model = load_draft(draft_dir, device=self.device, dtype=self.dtype)
        target = target_spec(self.vllm_config.model_config.hf_config)
        backend = select_backend(self.device)
        # Kept off `self.model`: the runner wraps a drafter's `.model` in CUDA-graph wrappers.
        self.sparrow_model = model
        self.drafter = SparrowDrafter(
            model, OwnTokenIO(model, _TargetTokenIO(target_model)), target.visual_token_ids,
            backend, self.device, self.dtype,
        )
        cfg = model.cfg
        logger.info(
            "Sparrow draft %s loaded: text-only window cache (anchors=%d, window=%s, block=%d), "
            "attention backend %s, visual token ids %s skipped",
            draft_dir, cfg.anchor_tokens, cfg.window_tokens, cfg.cache_block_size,
            backend.name, list(target.visual_token_ids),
        )

    def initialize_attn_backend(self, kv_cache_config, kernel_block_sizes=None) -> None:
        # No vLLM attention layers and no vLLM KV cache for the draft. Group 0's metadata
        # (query_start_loc, seq_lens) is all the runner needs to hand us.
        self.kv_cache_gid = 0
        self.draft_attn_groups = []

    def initialize_cudagraph_keys(self, cudagraph_mode) -> None:
        pass  # the draft runs eagerly

    def validate_same_kv_cache_group(self, kv_cache_config) -> None:
        pass

    def dummy_run(self, num_tokens: int, *args, **kwargs) -> None:
        pass  # no collectives and nothing to warm up

    def release_requests(self, req_ids) -> None:
        if self.drafter is not None:
            self.drafter.release(req_ids)

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
        assert self.drafter is not None, "load_model() was not called"
        batch = self._step_batch(
            target_token_ids, target_hidden_states, next_token_ids,
            common_attn_metadata, num_rejected_tokens_gpu,
        )
        draft_ids, probs = self.drafter.step(
            batch, num_speculative_tokens, self._sampler(sampling_metadata)
        )
        self._last_draft_probs = probs
        return draft_ids

    def _step_batch(self, token_ids, hidden, next_token_ids, cm, num_rejected) -> StepBatch:
        n = cm.num_reqs
        qsl = cm.query_start_loc_cpu[: n + 1].tolist()
        seq_lens = cm.seq_lens[:n].cpu().tolist()
        rejected = num_rejected[:n].cpu().tolist() if num_rejected is not None else [0] * n
        req_ids = list(self.runner.input_batch.req_ids[:n])
        query_lens = [qsl[i + 1] - qsl[i] for i in range(n)]
        return StepBatch(
            req_ids=req_ids,
            token_ids=token_ids.long(),
            hidden=hidden,
            row_start=qsl[:n],
            num_valid=[q - r for q, r in zip(query_lens, rejected)],
            seq_start=[s - q for s, q in zip(seq_lens, query_lens)],
            num_prompt_tokens=[self.runner.requests[r].num_prompt_tokens for r in req_ids],
            next_token=next_token_ids[:n].long(),
            mid_prefill=[bool(x) for x in self.runner.discard_request_mask.np[:n]],
        )

    def _sampler(self, md) -> Sampler:
        if not self._enable_probabilistic_draft_probs or md.all_greedy:
            return lambda logits, rows: (logits.argmax(dim=-1), None)
        gen = self.draft_generator

        def sample(logits: torch.Tensor, rows: torch.Tensor):
            temp = md.temperature[rows].float()  # [R]
            greedy = temp < _SAMPLING_EPS
            probs = (logits.float() / torch.where(greedy, 1.0, temp)[:, None]).softmax(-1)
            ids = torch.multinomial(probs, 1, generator=gen).squeeze(-1)
            return torch.where(greedy, probs.argmax(-1), ids), probs

        return sample
