"""The drafting strategy an engine drafts with, chosen once when the draft loads, from inputs
read here (the draft's config, Sparrow's variables, vLLM's engine config).

The one place of the rule: tree search (when configured) drafts every greedy step, unless the
runner budgets each request's verification from per-position confidences (vLLM 0.34's adaptive
verification: a searched path has no chain of confidences to budget); otherwise the chain,
whose greedy decode steps replay in CUDA graphs (one per batch bucket and depth the engine's
schedule can ask for) when vLLM captures graphs, except with adaptive length, whose chain reads
each step's confidences to stop once no request would verify more (the captured step keeps no
confidences and always drafts its depth).
The peers are chain.py (the chain, adaptive length's chain), tree.py and graphs.py. A new peer
is a file beside them and a line of `choose_drafting`; a runner's glue only asks the peer it is
handed what drafting/step.py's DraftingStrategy lets it ask.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from .. import LOGGER, envs
from .chain import ChainDrafting, StoppingChainDrafting
from .graphs import DecodeGraphs, GraphDrafting, default_buckets
from .sampling import Sampler, greedy
from .step import DecodeCore, DraftingStrategy
from .tree import TreeDrafting, TreeSpec

logger = logging.getLogger(LOGGER)  # the logger vLLM's init_logger(LOGGER) returns


@dataclass(frozen=True)
class DraftingChoice:
    """The rule's inputs."""

    tree: TreeSpec | None  # the search's spec (None: chains)
    stop_confidence: float | None  # adaptive length's threshold as served (None: off)
    graph_mode: str | None  # "capture" (CUDA graphs), "eager" (their static buffers) or None (plain eager)
    buckets: tuple[int, ...]  # batch sizes the decode graphs cover
    depths: tuple[int, ...] = ()  # depths the engine's schedule can ask for (besides num_draft)
    confidences_read: bool = False  # the runner budgets verification from per-position confidences

    @classmethod
    def for_engine(cls, vllm_config, cfg, device, num_draft: int, per_request_lengths: bool) -> DraftingChoice:
        """cfg: the draft's SparrowConfig; per_request_lengths: whether the runner can verify a
        different number of drafts per request (adaptive length needs it)."""
        spec = vllm_config.speculative_config
        threshold = adaptive_length(stop_confidence(cfg), vllm_config.scheduler_config.async_scheduling,
                                    per_request_lengths)
        schedule = getattr(spec, "num_speculative_tokens_per_batch_size", None) or ()
        return cls(tree_spec(cfg, num_draft), threshold, draft_graph_mode(vllm_config, device),
                   tuple(default_buckets(vllm_config.scheduler_config.max_num_seqs)),
                   tuple(sorted({int(e[2]) for e in schedule})),
                   bool(getattr(spec, "enable_adaptive_verification", False)))


def choose_drafting(drafter: DecodeCore, num_draft: int, choice: DraftingChoice,
                    sample: Sampler = greedy) -> DraftingStrategy:
    """sample: the greedy sampler of the engine's decode steps (the one its CUDA graphs replay)."""
    if choice.tree is not None and not choice.confidences_read:
        return TreeDrafting(choice.tree, choice.stop_confidence)
    if choice.tree is not None:
        logger.warning("Sparrow: tree search (topk %d, budget %d) is off: vLLM's adaptive verification budgets "
                       "each request's drafts from per-position confidences, which a searched path does not have. "
                       "Drafting the chain.", choice.tree.topk, choice.tree.budget)
    if choice.stop_confidence is not None:
        return StoppingChainDrafting(choice.stop_confidence)
    if choice.graph_mode is None:
        return ChainDrafting()
    graphs = DecodeGraphs(drafter, num_draft, list(choice.buckets), capture=choice.graph_mode == "capture",
                          depths=choice.depths, sample=sample)
    return GraphDrafting(graphs, ChainDrafting())


def tree_spec(cfg, num_draft: int) -> TreeSpec | None:
    """The draft's tree search: SPARROW_TREE_TOPK / SPARROW_TREE_BUDGET (numbers, or "off"),
    else the draft config's tree_topk / tree_budget. None (or topk 1): today's greedy chain."""
    topk = _override(envs.SPARROW_TREE_TOPK, cfg.tree_topk)
    if topk is None or topk <= 1:
        return None
    budget = _override(envs.SPARROW_TREE_BUDGET, cfg.tree_budget)  # read only with the tree on, as before
    if budget is None:
        budget = topk * max(num_draft - 1, 1)
    if budget < topk:
        raise ValueError(f"tree_budget={budget} is below tree_topk={topk}: the search expands "
                         f"tree_topk nodes per level, so give it at least {topk} (or turn the tree off)")
    return TreeSpec(topk, budget)


def _override(env, configured):
    """An environment override of a config value: unset (None) keeps the config's, "off" is None."""
    if env is None:
        return configured
    return None if env == "off" else env


def stop_confidence(cfg) -> float | None:
    """The adaptive-length threshold: SPARROW_STOP_CONFIDENCE (a number, or "off"), else the
    draft config's stop_confidence."""
    return _override(envs.SPARROW_STOP_CONFIDENCE, cfg.stop_confidence)


def adaptive_length(threshold: float | None, async_scheduling: bool | None,
                    per_request_lengths: bool = True) -> float | None:
    """The stop_confidence to serve with: adaptive length hands vLLM a draft length per request
    (a list of lists), which vLLM's async scheduling cannot take (its runner asserts a [B, K]
    tensor), so under async scheduling it is off, said once in the log, and never an assert."""
    if threshold is not None and not per_request_lengths:
        logger.warning("Sparrow: adaptive length (stop_confidence %s) is off: vLLM's Model Runner V2 verifies "
                       "the same number of drafts for every request of a step (a shorter chain would have to be "
                       "padded with tokens the target then checks). Drafting K tokens per request; the runner's own "
                       "per-request budget is --speculative-config's \"enable_adaptive_verification\": true (full "
                       "CUDA graphs), which Sparrow feeds its draft confidences.", threshold)
        return None
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
