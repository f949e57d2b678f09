"""The Sparrow draft as a serving engine holds it, whichever vLLM model runner it serves.

`load_serving_draft` is what both glues call when vLLM hands them the target model (the V1
runner's proposer in load_model, proposer.py; the V2 runner's speculator, v2_runner/): the draft
loaded from its directory, its text-only window cache sized by max_num_seqs (refused with a
message when it cannot fit), its token I/O (its own embedding and LM head, else the target's, on
its reduced vocabulary where it ships one), the drafter, and the drafting strategy chosen once
(drafting/choice.py, which reads its own inputs), its CUDA graphs captured. The ServingDraft it
returns is the engine-side object both glues drive: a step, the profile step, the release of
ended requests, the sampled draft's seeded generator, the prompts' layouts, the stats; a glue
keeps only what its runner needs translated. Reads of vLLM are of VllmConfig fields both
runners' releases define.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from . import LOGGER, envs
from .attention import select_backend
from .checkpoint import load_draft
from .draft_vocab import SubsetLogits, load_vocab
from .drafter import SparrowDrafter
from .drafting.choice import DraftingChoice, choose_drafting
from .drafting.noise import RequestNoise
from .drafting.sampling import QStore, Sampled, Sampler, greedy
from .drafting.step import Drafts, DraftingStrategy, StepBatch
from .host_memory import DEFAULT_INTERVAL_S, HostMemoryReturner
from .model import OwnTokenIO, SparrowDraftModel, TargetTokenIO
from .prompt_layout import PromptLayouts
from .targets import target_spec
from .window import TextWindowCache, WindowSpec


from vllm.logger import init_logger

logger = init_logger(LOGGER)


@dataclass
class ServingDraft:
    """What a glue holds of the draft while it serves, and what it asks of it."""

    model: SparrowDraftModel  # kept off a glue's `.model`: vLLM's runners wrap that one
    drafter: SparrowDrafter
    drafting: DraftingStrategy
    layouts: PromptLayouts  # each live request's visual placeholder spans (the glue records them)
    generator: torch.Generator  # sampled drafts' noise without per-request seeds, seeded by the engine's seed
    host_memory: HostMemoryReturner  # gives freed host pages back as requests end

    @property
    def visual_ids(self) -> np.ndarray:
        return self.layouts.visual_ids  # [V] int64 the target's visual placeholder token ids

    def step(self, batch: StepBatch, num_draft: int, sample: Sampler = greedy) -> Drafts:
        """One engine step: the batch's target states committed, num_draft tokens drafted per
        request by the chosen strategy."""
        return self.drafting.step(self.drafter, batch, num_draft, sample)

    def sampled(self, temperature: torch.Tensor, store: QStore, noise: RequestNoise | None = None) -> Sampled:
        """A step's sampled draft (temperature [>= B] by batch row), q kept in the runner's store;
        its noise keyed by request where the glue gives a RequestNoise, else the engine's."""
        return Sampled(temperature, noise if noise is not None else self.generator, store)

    def profile(self, num_tokens: int, num_requests: int, num_draft: int, store: QStore | None = None) -> int:
        """vLLM's memory profile: the largest step, drafted as the engine drafts, every request
        sampled when a store keeps q (drafter.profile_step). Returns the packed rows run."""
        device = self.drafter.device
        # keyed noise: its CPU path's hashing temporaries are the larger (the kernel has none)
        noise = RequestNoise(torch.zeros(num_requests, dtype=torch.int64, device=device),
                             torch.zeros(num_requests, dtype=torch.int64, device=device))
        sample = greedy if store is None else self.sampled(torch.ones(num_requests, device=device), store, noise)
        return self.drafter.profile_step(num_tokens, num_requests, num_draft, self.drafting, sample)

    def release(self, req_ids) -> None:
        """Requests that finished, were aborted or left the runner: their slots and layouts go."""
        req_ids = list(req_ids)
        self.drafter.release(req_ids)
        self.layouts.drop(req_ids)
        self.host_memory.maybe_release()  # the ended requests' step temporaries are free now

    def release_all(self) -> None:
        self.release(self.drafter.tracked())
        self.layouts.by_request.clear()

    def stats(self) -> dict:
        """The drafter's accounting (SparrowDrafter.stats, with the prompt layouts held beside it in
        "held"), the host-memory returner's, and the strategy as it describes itself
        (engine_stats.drafter_stats reads it from either glue)."""
        stats = self.drafter.stats()
        stats["held"]["prompt_layouts"] = len(self.layouts.by_request)  # live requests only
        stats["host_memory"] = dataclasses.asdict(self.host_memory.stats)
        return {**stats, **self.drafting.describe()}


def load_serving_draft(vllm_config, draft_dir: str, target_model: torch.nn.Module, device, dtype,
                       num_draft: int, max_model_len: int, glue: str, per_request_lengths: bool = True,
                       sample: Sampler = greedy) -> ServingDraft:
    """glue: which glue serves and what it changed of vLLM, for the load line (vLLM configures its
    logging after plugins load, so this line, written by the worker, is the one that surely
    reaches vLLM's log); per_request_lengths: whether the runner can verify a different number of
    drafts per request (adaptive length needs it); sample: the glue's greedy sampler (the one the
    decode steps' CUDA graphs replay)."""
    model = load_draft(draft_dir, device=device, dtype=dtype)
    target = target_spec(vllm_config.model_config.hf_config)
    backend = select_backend(device)
    cfg = model.cfg
    max_seqs = vllm_config.scheduler_config.max_num_seqs
    spec = WindowSpec(cfg.anchor_tokens, cfg.window_tokens)
    need = TextWindowCache.bytes_needed(spec, max_seqs, num_draft, max_model_len,
                                        cfg.num_key_value_heads, cfg.head_dim, dtype)
    check_cache_budget(need, device, max_seqs, cfg.window_tokens)
    io = token_io(vllm_config, model, target_model, draft_dir)
    drafter = SparrowDrafter(model, io, target.visual_token_ids, backend, device, dtype, max_requests=max_seqs,
                             max_draft_tokens=num_draft, max_text_tokens=max_model_len)
    choice = DraftingChoice.for_engine(vllm_config, cfg, device, num_draft, per_request_lengths)
    drafting = choose_drafting(drafter, num_draft, choice, sample)
    # Its CUDA graphs now, while the runner loads the model and before vLLM profiles memory: their
    # private pool is then part of the memory vLLM counts as the model's, not taken from the KV
    # cache it sized (a capture at vLLM's own capture time comes after that sizing).
    drafting.capture()
    what = drafting.describe()
    logger.info(
        "Sparrow draft %s loaded (%s): drafting up to %d tokens per step, %s-token draft vocabulary, %s%s, "
        "decode steps %s; text-only window cache (anchors=%d, window=%s) of %d slots x %d rows = %.1f MiB, "
        "attention backend %s, visual token ids %s skipped",
        draft_dir, glue, num_draft, "full" if drafter.vocab_ids is None else drafter.vocab_ids.numel(),
        what["drafting"], "" if what["tree"] is None else f" (topk {what['tree'][0]}, budget {what['tree'][1]})",
        what["decode_steps"], cfg.anchor_tokens, cfg.window_tokens, max_seqs, drafter.cache.capacity,
        drafter.cache.nbytes / 2**20, backend.name, list(target.visual_token_ids),
    )
    generator = torch.Generator(device=device)
    generator.manual_seed(vllm_config.model_config.seed or 0)
    return ServingDraft(model, drafter, drafting, PromptLayouts(np.asarray(target.visual_token_ids, dtype=np.int64)),
                        generator, HostMemoryReturner(host_memory_interval()))


def token_io(vllm_config, model: SparrowDraftModel, target_model: torch.nn.Module, draft_dir: str):
    """The draft's embedding and LM head (its own, else the target's), on the draft's
    reduced vocabulary when it ships one and the head allows it."""
    io = OwnTokenIO(model, TargetTokenIO(target_model))
    ids = load_vocab(draft_dir)
    if ids is None:
        return io
    vocab = vllm_config.model_config.get_vocab_size()
    if model.lm_head is not None:
        return SubsetLogits(io, ids, model.lm_head.weight, vocab)
    head, why = _plain_target_head(target_model, vllm_config.parallel_config.tensor_parallel_size)
    if head is None:
        logger.warning("Sparrow: the draft's reduced vocabulary is not used (%s); drafting over "
                          "the full vocabulary", why)
        return io
    return SubsetLogits(io, ids, head, vocab)


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


def host_memory_interval() -> float | None:
    """Seconds between releases of the allocator's free pages at the most (host_memory.py):
    SPARROW_HOST_MEMORY_RELEASE, a number or "off" (None: never), else DEFAULT_INTERVAL_S."""
    env = envs.SPARROW_HOST_MEMORY_RELEASE
    if env is None:
        return DEFAULT_INTERVAL_S
    return None if env == "off" else env


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
