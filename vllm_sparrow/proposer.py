"""The vLLM-facing proposer: target hidden states in, draft token ids out.

A V1 `EagleProposer` subclass (the runner type-checks its drafter against EagleProposer), built
by method_patches.py for method "sparrow". It replaces the EAGLE data path: vLLM allocates no draft
KV cache and never feeds visual embeddings to the draft; each step is translated into a
`StepBatch` and handed to `SparrowDrafter`, which owns the text-only window cache (allocated
once at load time, sized by max_num_seqs, refused with a message when it cannot fit), with the
drafting strategy chosen at load (drafting.py). What it reads from the runner and from the
EagleProposer base, and the methods it overrides, are rows of vllm_reads.py, checked at start-up.
"""

from __future__ import annotations


import dataclasses
import weakref

import numpy as np
import torch
from vllm.v1.spec_decode.eagle import EagleProposer

from . import envs
from .attention import select_backend
from .checkpoint import load_draft
from .draft_graphs import GraphDrafting, default_buckets
from .draft_step import Drafts, DraftingStrategy, kept_drafts
from .draft_vocab import SubsetLogits, load_vocab
from .drafter import Sampler, SparrowDrafter, StepBatch, greedy, sampled
from .drafting import choose_drafting
from .host_memory import DEFAULT_INTERVAL_S, HostMemoryReturner
from .model import OwnTokenIO
from .targets import target_spec
from .tree_search import TreeDrafting, tree_spec
from .window import TextWindowCache, WindowSpec

from vllm.logger import init_logger

logger = init_logger("vllm_sparrow")


class _TargetTokenIO:
    """The target's embedding and LM head (TP-aware, via the model's public interface), held
    weakly: at shutdown vLLM's runner drops the target (runner.shutdown sets model = None) so
    the next engine in the process gets its memory; a strong reference here would keep every
    weight alive (a 7B target on one GPU: the next engine could not start)."""

    def __init__(self, target_model: torch.nn.Module) -> None:
        lm = target_model.get_language_model() if hasattr(target_model, "get_language_model") else target_model
        self._embed = weakref.WeakMethod(lm.embed_input_ids)
        self._logits = weakref.WeakMethod(target_model.compute_logits)

    @staticmethod
    def _live(method: weakref.WeakMethod):
        fn = method()
        if fn is None:
            raise RuntimeError("the target model was released: its engine has shut down")
        return fn

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self._live(self._embed)(token_ids)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._live(self._logits)(hidden)


class SparrowProposer(EagleProposer):
    def __init__(self, vllm_config, device, runner=None):
        super().__init__(vllm_config, device, runner)
        self.runner = runner
        # Visual embeddings never reach the draft (the runner then skips gathering them).
        self.supports_mm_inputs = False
        # (`drafter` is what vLLM's runner calls this proposer; the Sparrow drafter is ours.)
        self.sparrow_drafter: SparrowDrafter | None = None
        self.drafting: DraftingStrategy | None = None
        self.draft_generator = torch.Generator(device=device)
        self.draft_generator.manual_seed(vllm_config.model_config.seed or 0)
        self.host_memory = HostMemoryReturner(host_memory_interval())

    # ---- set-up called by the runner ----------------------------------------------
    def load_model(self, target_model: torch.nn.Module) -> None:
        draft_dir = self.speculative_config.model
        model = load_draft(draft_dir, device=self.device, dtype=self.dtype)
        target = target_spec(self.vllm_config.model_config.hf_config)
        backend = select_backend(self.device)
        cfg = model.cfg
        max_seqs = self.vllm_config.scheduler_config.max_num_seqs
        k = self.num_speculative_tokens
        spec = WindowSpec(cfg.anchor_tokens, cfg.window_tokens)
        need = TextWindowCache.bytes_needed(spec, max_seqs, k, self.max_model_len,
                                            cfg.num_key_value_heads, cfg.head_dim, self.dtype)
        check_cache_budget(need, self.device, max_seqs, cfg.window_tokens)
        # Kept off `self.model`: the runner wraps a drafter's `.model` in CUDA-graph wrappers.
        self.sparrow_model = model
        self._visual_ids = np.asarray(target.visual_token_ids, dtype=np.int64)
        self._visual_count: dict[str, int] = {}  # request id -> visual placeholders in its prompt
        io = self._token_io(model, target_model, draft_dir)
        drafter = self.sparrow_drafter = SparrowDrafter(
            model, io, target.visual_token_ids,
            backend, self.device, self.dtype, max_requests=max_seqs, max_draft_tokens=k,
            max_text_tokens=self.max_model_len,
        )
        self.stop_confidence = adaptive_length(stop_confidence(cfg), self.vllm_config.scheduler_config.async_scheduling)
        mode = draft_graph_mode(self.vllm_config, self.device)
        self.drafting = choose_drafting(drafter, k, tree_spec(cfg, k), self.stop_confidence, mode,
                                        default_buckets(max_seqs))
        graphs = self.drafting.graphs if isinstance(self.drafting, GraphDrafting) else None
        logger.info(
            "Sparrow draft %s loaded: drafting %d tokens per step, %s-token draft vocabulary, %s, decode steps %s; text-only window cache (anchors=%d, window=%s) of %d slots x "
            "%d rows = %.1f MiB, attention backend %s, visual token ids %s skipped",
            draft_dir, k, "full" if drafter.vocab_ids is None else drafter.vocab_ids.numel(),
            f"tree search {self.drafting.spec}" if isinstance(self.drafting, TreeDrafting) else self.drafting.name,
            "eager" if graphs is None else ("in CUDA graphs" if graphs.capture_enabled else "on static buffers"),
            cfg.anchor_tokens, cfg.window_tokens, max_seqs, drafter.cache.capacity,
            drafter.cache.nbytes / 2**20, backend.name, list(target.visual_token_ids),
        )

    def _token_io(self, model, target_model, draft_dir):
        """The draft's embedding and LM head (its own, else the target's), on the draft's
        reduced vocabulary when it ships one and the head allows it."""
        io = OwnTokenIO(model, _TargetTokenIO(target_model))
        ids = load_vocab(draft_dir)
        if ids is None:
            return io
        vocab = self.vllm_config.model_config.get_vocab_size()
        if model.lm_head is not None:
            return SubsetLogits(io, ids, model.lm_head.weight, vocab)
        head, why = _plain_target_head(target_model, self.vllm_config.parallel_config.tensor_parallel_size)
        if head is None:
            logger.warning("Sparrow: the draft's reduced vocabulary is not used (%s); drafting over "
                           "the full vocabulary", why)
            return io
        return SubsetLogits(io, ids, head, vocab)

    def initialize_attn_backend(self, kv_cache_config, kernel_block_sizes=None) -> None:
        # No vLLM attention layers and no vLLM KV cache for the draft. Group 0's metadata
        # (query_start_loc, seq_lens) is all the runner needs to hand us.
        self.kv_cache_gid = 0
        self.draft_attn_groups = []

    def initialize_cudagraph_keys(self, cudagraph_mode) -> None:
        pass  # vLLM's graph wrappers are not used: draft_graphs.py captures the decode step itself

    def validate_same_kv_cache_group(self, kv_cache_config) -> None:
        pass

    def dummy_run(self, num_tokens: int, *args, is_graph_capturing: bool = False, **kwargs) -> None:
        # The cache is allocated at load time, before vLLM profiles memory; at vLLM's graph
        # capture, the decode step is captured once for every batch bucket. Otherwise (vLLM's
        # memory profile among them) the largest step of num_tokens rows runs, so the draft's
        # activations are in the peak vLLM budgets for.
        if self.sparrow_drafter is None:
            return
        if is_graph_capturing:
            if isinstance(self.drafting, GraphDrafting):
                self.drafting.graphs.capture()
            return
        max_seqs = self.vllm_config.scheduler_config.max_num_seqs
        rows = self.sparrow_drafter.profile_step(num_tokens, max_seqs, self.num_speculative_tokens)
        self.profiled_rows = max(getattr(self, "profiled_rows", 0), rows)

    def release_requests(self, req_ids) -> None:
        if self.sparrow_drafter is not None:
            self.sparrow_drafter.release(req_ids)
        for r in req_ids:
            self._visual_count.pop(r, None)
        self.host_memory.maybe_release()  # the ended requests' step temporaries are free now

    def sparrow_stats(self) -> dict:
        """The drafter's accounting (SparrowDrafter.stats, with what this proposer holds per
        request beside it in "held") and the drafting strategy: its name and, for tree search,
        [topk, budget] (engine_stats.drafter_stats reads it)."""
        tree = self.drafting.spec if isinstance(self.drafting, TreeDrafting) else None
        stats = self.sparrow_drafter.stats()
        stats["held"]["visual_counts"] = len(self._visual_count)  # live requests only: freed at release
        stats["host_memory"] = dataclasses.asdict(self.host_memory.stats)
        return {**stats, "drafting": self.drafting.name,
                "tree": None if tree is None else [tree.topk, tree.budget]}

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
        assert self.sparrow_drafter is not None, "load_model() was not called"
        batch = self._step_batch(
            target_token_ids, target_hidden_states, next_token_ids,
            common_attn_metadata, num_rejected_tokens_gpu,
        )
        drafts = self.sparrow_drafter.step(
            batch, num_speculative_tokens, self._sampler(sampling_metadata), self.drafting
        )
        self._last_draft_probs = drafts.probs
        if self.stop_confidence is not None and drafts.probs is None:
            return self._trimmed(drafts)
        return drafts.ids

    def _trimmed(self, drafts: Drafts) -> list[list[int]]:
        """Adaptive length: vLLM's scheduler schedules exactly each request's kept drafts to
        verify. Reads the drafts back to the host (vLLM's non-async path does that anyway)."""
        return kept_drafts(drafts, self.stop_confidence)

    def _step_batch(self, token_ids, hidden, next_token_ids, cm, num_rejected) -> StepBatch:
        """The engine step as the drafter sees it, without reading anything back from the
        device: per-request counts come from the runner's host arrays or stay on the device."""
        n = cm.num_reqs
        qsl = cm.query_start_loc[: n + 1]  # [B + 1] device
        query_lens = qsl[1:] - qsl[:-1]  # [B]
        num_valid = query_lens - num_rejected[:n] if num_rejected is not None else query_lens
        batch = self.runner.input_batch
        prompt_lens = torch.from_numpy(batch.num_prompt_tokens[:n].astype(np.int64))
        # Tokens computed before this step (exact while any prompt remains: only draft tokens make
        # the runner's count optimistic), so >= prompt length means no row of the step is a prompt
        # position: every request decodes, and the drafter takes its fixed-shape path.
        computed, prompt = batch.num_computed_tokens_cpu[:n], batch.num_prompt_tokens[:n]
        decoding = bool((computed >= prompt).all())
        query_start = cm.query_start_loc_cpu[: n + 1].numpy().astype(np.int64)
        return StepBatch(
            req_ids=list(batch.req_ids[:n]),
            token_ids=token_ids.long(),
            hidden=hidden,
            query_start=query_start,
            num_valid=num_valid.long(),
            seq_start=(cm.seq_lens[:n] - query_lens).long(),
            num_prompt_tokens=self.sparrow_drafter.to_device(prompt_lens),
            next_token=next_token_ids[:n].long(),
            mid_prefill=self.runner.discard_request_mask.gpu[:n],
            decode_only=decoding,
            text_bound=computed + np.diff(query_start) - self._visual_counts(batch, n),
            text_rows=None if decoding else self._text_rows(batch, n, np.diff(query_start)),
        )

    def _text_rows(self, batch, n: int, qlen: np.ndarray) -> np.ndarray:
        """[B] rows of this step less the visual placeholders among them, from the runner's host
        copy of the tokens: sizes the packed layout of a step with prompt chunks (a video chunk's
        placeholders take no draft rows). Decode rows are all text."""
        rows = qlen.copy()
        computed, prompt = batch.num_computed_tokens_cpu[:n], batch.num_prompt_tokens[:n]
        for i in np.flatnonzero(computed < prompt):
            lo, hi = int(computed[i]), int(min(computed[i] + qlen[i], prompt[i]))
            rows[i] -= int(np.isin(batch.token_ids_cpu[i, lo:hi], self._visual_ids).sum())
        return rows

    def _visual_counts(self, batch, n: int) -> np.ndarray:
        """[B] visual placeholders in each request's prompt, counted once per request from the
        runner's host copy of its tokens."""
        counts = self._visual_count
        for i, r in enumerate(batch.req_ids[:n]):
            if r not in counts:
                prompt = batch.token_ids_cpu[i, : batch.num_prompt_tokens[i]]
                counts[r] = int(np.isin(prompt, self._visual_ids).sum())
        return np.fromiter((counts[r] for r in batch.req_ids[:n]), dtype=np.int64, count=n)

    def _sampler(self, md) -> Sampler:
        if not self._enable_probabilistic_draft_probs or md.all_greedy:
            return greedy
        return sampled(md.temperature, self.draft_generator)


def _plain_target_head(target_model, tp: int):
    """(weight [vocab, H], "") of the target's LM head when its logits are a plain matmul on
    one rank, else (None, why)."""
    if tp > 1:
        return None, "tensor parallelism shards the LM head"
    lm = target_model.get_language_model() if hasattr(target_model, "get_language_model") else target_model
    head = getattr(lm, "lm_head", None)
    proc = getattr(lm, "logits_processor", None) or getattr(target_model, "logits_processor", None)
    weight = getattr(head, "weight", None)
    if weight is None or weight.ndim != 2 or weight.shape[0] == 0:
        return None, "the target's LM head weight is not reachable"
    if getattr(head, "bias", None) is not None or proc is None or getattr(proc, "scale", 1.0) != 1.0 \
            or getattr(proc, "soft_cap", None):
        return None, "the target's logits are not a plain matmul (bias, scale or soft cap)"
    return weight, ""


def stop_confidence(cfg) -> float | None:
    """The adaptive-length threshold: SPARROW_STOP_CONFIDENCE (a number, or "off"), else the
    draft config's stop_confidence."""
    env = envs.SPARROW_STOP_CONFIDENCE  # None (unset), "off" or a probability
    if env is None:
        return cfg.stop_confidence
    return None if env == "off" else env


def host_memory_interval() -> float | None:
    """Seconds between releases of the allocator's free pages at the most (host_memory.py):
    SPARROW_HOST_MEMORY_RELEASE, a number or "off" (None: never), else DEFAULT_INTERVAL_S."""
    env = envs.SPARROW_HOST_MEMORY_RELEASE
    if env is None:
        return DEFAULT_INTERVAL_S
    return None if env == "off" else env


def adaptive_length(threshold: float | None, async_scheduling: bool | None) -> float | None:
    """The stop_confidence to serve with: adaptive length hands vLLM a draft length per request
    (a list of lists), which vLLM's async scheduling cannot take (its runner asserts a [B, K]
    tensor), so under async scheduling it is off, said once in the log, and never an assert."""
    if threshold is None or not async_scheduling:
        return threshold
    logger.warning("Sparrow: adaptive length (stop_confidence %s) is off because async scheduling is on: "
                   "it gives each request its own draft length, which async scheduling cannot verify. "
                   "Drafting K tokens per request. Start the engine with --no-async-scheduling to use it.",
                   threshold)
    return None


def draft_graph_mode(vllm_config, device) -> str | None:
    """How decode steps run: "capture" (CUDA graphs, captured with vLLM's), "eager" (the same
    static-buffer step without capture: tests), or None (plain eager).

    Graphs follow vLLM's own switches (enforce_eager, cudagraph_mode); SPARROW_DRAFT_GRAPHS=off
    turns them off, =eager selects the static-buffer path on any device."""
    env = envs.SPARROW_DRAFT_GRAPHS  # None (unset), "off" or "eager"
    if env is not None:
        return None if env == "off" else "eager"
    spec = vllm_config.speculative_config
    mode = getattr(vllm_config.compilation_config, "cudagraph_mode", None)
    if (torch.device(device).type != "cuda" or vllm_config.model_config.enforce_eager
            or getattr(spec, "enforce_eager", False) or mode is None or mode.name == "NONE"):
        return None
    if vllm_config.parallel_config.tensor_parallel_size > 1:
        logger.info("Sparrow: decode steps run eagerly with tensor parallelism (the LM head's "
                    "gather across ranks is not captured)")
        return None
    return "capture"


def check_cache_budget(need: int, device: torch.device, max_seqs: int, window: int | None) -> None:
    """Refuse, at start-up, a draft cache that cannot fit in the free memory of the device."""
    dev = torch.device(device)
    if dev.type == "cuda":
        free, _ = torch.cuda.mem_get_info(dev)
    else:
        import psutil

        free = psutil.virtual_memory().available
    if need > free * 0.9:
        hint = ("window_tokens: null keeps every text token of max_model_len per slot; "
                "lower max_model_len") if window is None else "lower window_tokens"
        raise DraftCacheTooLarge(
            f"the Sparrow draft cache needs {need / 2**30:.2f} GiB ({max_seqs} slots, one per "
            f"max_num_seqs), but only {free / 2**30:.2f} GiB is free on {dev}. Lower max_num_seqs, "
            f"or {hint}.")


class DraftCacheTooLarge(RuntimeError):
    pass
