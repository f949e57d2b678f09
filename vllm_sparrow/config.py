"""The draft's knobs: one dataclass, the single source of each of them.

Serialised into the draft checkpoint's config.json in the speculators convention
(`speculators_model_type: "sparrow"`, `transformer_layer_config`, `speculators_config`) plus
Sparrow's own top-level fields. Training and serving both read it from there.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .knobs import knob, optional_window
from .durable import atomic_write_text

SPECULATORS_MODEL_TYPE = "sparrow"
DRAFT_ARCHITECTURE = "SparrowDraftModel"
CONFIG_FILE = "config.json"
# The deepest chain a Sparrow draft is served at, and the one limit every command takes (the plugin's
# start-up check, sparrow caption / bench / tune, the training replay and the depth it records):
# vLLM's rejection sampler verifies chains up to 128, and the hard world's replay still gains from
# depth 8 to 16 (docs/benchmarks.md, the depth and tree tables).
MAX_SPECULATIVE_TOKENS = 16


# config.json fields read into SparrowConfig (from_json_dict); the shape fields must be there.
_REQUIRED_LAYER_FIELDS = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                          "intermediate_size", "vocab_size")
_TOP_LEVEL_FIELDS = ("anchor_tokens", "window_tokens", "ivsb_layer", "stop_confidence", "tree_topk", "tree_budget",
                     "depth_per_batch_size", "has_own_embed_tokens", "has_own_lm_head")


def _present(source: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    """{field: source[key]} for the `names` (field -> key) that source holds."""
    return {f: source[k] for f, k in names.items() if k in source}


class DraftConfigError(ValueError):
    """A draft directory or config that cannot be used; the message says what to do."""


@dataclass
class LayerShape:
    """Shape of a one-layer draft (model.DecoderBody), shared by every draft kind. Drafts work
    in the target's hidden space (they read its hidden states and share its embedding and LM
    head), so hidden_size must equal the target's."""

    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise DraftConfigError(
                f"num_attention_heads={self.num_attention_heads} must be a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )


def target_layer_shape(target_hf_config) -> dict[str, Any]:
    """The LayerShape fields of a draft for a target (a transformers config): its text model's
    width, heads, MLP width, vocabulary, norm epsilon and RoPE base."""
    text = target_hf_config.get_text_config()
    heads = text.num_attention_heads
    rope = getattr(text, "rope_theta", None) or (getattr(text, "rope_parameters", None) or {}).get("rope_theta", 1e4)
    return dict(hidden_size=int(text.hidden_size), num_attention_heads=heads,
                num_key_value_heads=getattr(text, "num_key_value_heads", None) or heads,
                head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads,
                intermediate_size=text.intermediate_size, vocab_size=int(text.vocab_size),
                rms_norm_eps=getattr(text, "rms_norm_eps", 1e-6), rope_theta=float(rope))


@dataclass
class SparrowConfig(LayerShape):
    """Shape and behaviour of a Sparrow draft (one decoder layer, EAGLE-style input)."""

    # Text-anchored window attention: each draft query sees the first `anchor_tokens` text
    # tokens of its request plus the last `window_tokens` text tokens (itself included).
    # window_tokens=None means every text token.
    anchor_tokens: int = knob(4, "anchor text tokens A", flag="--anchors")
    window_tokens: int | None = knob(512, "window text tokens W, or 'none' for all", flag="--window",
                                     parse=optional_window)

    # Training only: the target layer whose visual hidden states IVSB feeds the draft.
    ivsb_layer: int | None = None

    # Whether the checkpoint carries its own embedding / LM head (else the target's are used).
    has_own_embed_tokens: bool = False
    has_own_lm_head: bool = False

    # The verifier this draft was made for, and the default number of drafted tokens.
    verifier_name_or_path: str = ""
    verifier_architecture: str = ""
    verifier_num_layers: int | None = None
    verifier_weights: str | None = None  # fingerprint.weights_fingerprint of the verifier's folder
    speculative_tokens: int = knob(3, "default number of speculative tokens", flag="--k")
    # Adaptive length: a request's chain stops where the product of its drafted tokens' draft
    # probabilities falls below this (None: always K tokens). SPARROW_STOP_CONFIDENCE overrides.
    stop_confidence: float | None = None
    # Depth per batch size, vLLM's num_speculative_tokens_per_batch_size schedule: [[first batch
    # size, last, depth], ...] (`sparrow tune` writes it from costs measured in vLLM); served when
    # the user sets neither num_speculative_tokens nor a schedule. None: speculative_tokens always.
    depth_per_batch_size: list[list[int]] | None = None
    # Tree search inside the draft (drafting/tree.py): score tree_topk children per node and keep
    # the tree_topk best nodes per level while tree_budget nodes last, then hand vLLM the best
    # path (None: the greedy chain). SPARROW_TREE_TOPK / SPARROW_TREE_BUDGET override.
    tree_topk: int | None = None
    tree_budget: int | None = None

    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.anchor_tokens < 0:
            raise DraftConfigError("anchor_tokens must be >= 0")
        if self.window_tokens is not None and self.window_tokens < 1:
            raise DraftConfigError("window_tokens must be >= 1, or null for all text tokens")

    # ---- speculators-format config.json ------------------------------------------------
    def to_json_dict(self) -> dict[str, Any]:
        layer = {
            "model_type": "llama",
            "architectures": [DRAFT_ARCHITECTURE],
            "hidden_size": self.hidden_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "num_hidden_layers": 1,
            "hidden_act": "silu",
            "max_position_embeddings": 1 << 20,  # positions count text tokens only
        }
        return {
            "architectures": [DRAFT_ARCHITECTURE],
            "speculators_model_type": SPECULATORS_MODEL_TYPE,
            "transformer_layer_config": layer,
            "speculators_config": {
                "algorithm": SPECULATORS_MODEL_TYPE,
                "default_proposal_method": "greedy",
                "proposal_methods": [
                    {"proposal_type": "greedy", "speculative_tokens": self.speculative_tokens}
                ],
                "verifier": {
                    "name_or_path": self.verifier_name_or_path,
                    "architectures": [self.verifier_architecture],
                    **({"num_hidden_layers": self.verifier_num_layers} if self.verifier_num_layers else {}),
                    **({"weights_fingerprint": self.verifier_weights} if self.verifier_weights else {}),
                },
            },
            "target_hidden_size": self.hidden_size,
            "anchor_tokens": self.anchor_tokens,
            "window_tokens": self.window_tokens,
            "ivsb_layer": self.ivsb_layer,
            **({"stop_confidence": self.stop_confidence} if self.stop_confidence is not None else {}),
            **({"depth_per_batch_size": self.depth_per_batch_size} if self.depth_per_batch_size else {}),
            **({"tree_topk": self.tree_topk} if self.tree_topk is not None else {}),
            **({"tree_budget": self.tree_budget} if self.tree_budget is not None else {}),
            "has_own_embed_tokens": self.has_own_embed_tokens,
            "has_own_lm_head": self.has_own_lm_head,
            **({"sparrow_extra": self.extra} if self.extra else {}),
        }

    @classmethod
    def from_json_dict(cls, d: dict[str, Any]) -> SparrowConfig:
        if d.get("speculators_model_type") != SPECULATORS_MODEL_TYPE:
            raise DraftConfigError(
                f"config.json has speculators_model_type={d.get('speculators_model_type')!r}, "
                f"expected {SPECULATORS_MODEL_TYPE!r}: this is not a Sparrow draft. Create one "
                "with `sparrow init-draft --target TARGET_DIR --out DRAFT_DIR` or train one."
            )
        try:
            layer = d["transformer_layer_config"]
            spec = d["speculators_config"]
            verifier = spec.get("verifier", {})
            # Only the fields the file holds: an absent one takes the dataclass default (one source).
            fields = {
                **{k: layer[k] for k in _REQUIRED_LAYER_FIELDS},
                **_present(layer, {"rms_norm_eps": "rms_norm_eps", "rope_theta": "rope_theta"}),
                **_present(d, {k: k for k in _TOP_LEVEL_FIELDS}),
                **_present(d, {"extra": "sparrow_extra"}),
                **_present(verifier, {"verifier_name_or_path": "name_or_path",
                                      "verifier_num_layers": "num_hidden_layers",
                                      "verifier_weights": "weights_fingerprint"}),
                "speculative_tokens": spec["proposal_methods"][0]["speculative_tokens"],
            }
            if verifier.get("architectures"):
                fields["verifier_architecture"] = verifier["architectures"][0]
            cfg = cls(**fields)
        except (KeyError, IndexError, TypeError) as e:
            raise DraftConfigError(f"Sparrow draft config.json is missing a field: {e}") from e
        if d.get("target_hidden_size", cfg.hidden_size) != cfg.hidden_size:
            raise DraftConfigError("target_hidden_size must equal transformer_layer_config.hidden_size")
        return cfg

    def save(self, draft_dir: str | Path) -> Path:
        path = Path(draft_dir) / CONFIG_FILE
        atomic_write_text(path, json.dumps(self.to_json_dict(), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, draft_dir: str | Path) -> SparrowConfig:
        path = Path(draft_dir) / CONFIG_FILE
        if not Path(draft_dir).is_dir():
            raise DraftConfigError(
                f"Sparrow draft directory {str(draft_dir)!r} does not exist. Pass the directory "
                "written by `sparrow init-draft` or `sparrow train` as speculative_config.model."
            )
        if not path.is_file():
            raise DraftConfigError(
                f"{str(draft_dir)!r} has no config.json, so it is not a Sparrow draft directory."
            )
        try:
            d = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise DraftConfigError(f"{path} is not valid JSON: {e}") from e
        return cls.from_json_dict(d)

    def replace(self, **changes: Any) -> SparrowConfig:
        return dataclasses.replace(self, **changes)
