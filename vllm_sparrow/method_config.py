"""What `method: "sparrow"` asks of vLLM's SpeculativeConfig, on every model runner.

Both glues call `prepare(spec)` while vLLM builds its SpeculativeConfig (V1: the patched
`__post_init__`, v1_runner/method_patches.py; V2: the registered config's `configure`,
v2_runner/method.py): the draft is validated against the target with messages that say what to
do, pipeline parallelism is refused, and a depth the user did not give is the draft's own (with
its per-batch-size schedule, `sparrow tune`). Reads only fields both vLLM releases define.
"""

from __future__ import annotations

from .checkpoint import check_depth, validate_draft_for_target
from .config import DraftConfigError, SparrowConfig


def prepare(spec) -> SparrowConfig:
    """Validates and completes `spec` (a vLLM SpeculativeConfig with method sparrow) in place;
    returns the draft's config."""
    pp = getattr(spec.target_parallel_config, "pipeline_parallel_size", 1)
    if pp > 1:
        # vLLM shares the target's embedding and LM head with a draft on the last PP rank only;
        # Sparrow's draft reads the target's states of every text position.
        raise DraftConfigError(
            f"the sparrow method does not support pipeline parallelism (pipeline_parallel_size={pp}): "
            "serve the target with tensor parallelism (--tensor-parallel-size) or without speculation")
    draft_cfg = validate_draft_for_target(spec.model, spec.target_model_config)
    if spec.num_speculative_tokens is None:
        _draft_depths(spec, draft_cfg)
    check_depth(spec.num_speculative_tokens, getattr(spec, "num_speculative_tokens_per_batch_size", None),
                spec.model, draft_cfg.speculative_tokens)
    return draft_cfg


def _draft_depths(spec, draft_cfg: SparrowConfig) -> None:
    """The user gave no depth: serve the draft's own, and its per-batch-size schedule when it has
    one and the user set none (`sparrow tune`); vLLM caps each entry at num_speculative_tokens."""
    spec.num_speculative_tokens = draft_cfg.speculative_tokens
    schedule = draft_cfg.depth_per_batch_size
    if schedule and getattr(spec, "num_speculative_tokens_per_batch_size", False) is None:
        spec.num_speculative_tokens_per_batch_size = [tuple(e) for e in schedule]
        spec.num_speculative_tokens = max(e[2] for e in schedule)
