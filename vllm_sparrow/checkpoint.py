"""Sparrow draft checkpoints: config.json (speculators convention) + model.safetensors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from . import envs
from .config import (CONFIG_FILE, MAX_SPECULATIVE_TOKENS, SPECULATORS_MODEL_TYPE, DraftConfigError, SparrowConfig,
                     target_layer_shape)
from .durable import atomic_save_safetensors
from .fingerprint import weights_fingerprint
from .model import SparrowDraftModel, seeded_draft
from .targets import UnsupportedTargetError, target_spec

WEIGHTS_FILE = "model.safetensors"


def save_draft(model: SparrowDraftModel, out_dir: str | Path) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    atomic_save_safetensors(out / WEIGHTS_FILE, state, metadata={"format": "pt"})
    model.cfg.save(out)  # last: a directory with a config.json holds whole weights
    return out


def load_draft(draft_dir: str | Path, device: torch.device | str = "cpu",
               dtype: torch.dtype = torch.float32) -> SparrowDraftModel:
    cfg = SparrowConfig.load(draft_dir)
    weights = Path(draft_dir) / WEIGHTS_FILE
    if not weights.is_file():
        raise DraftConfigError(f"{str(draft_dir)!r} has no {WEIGHTS_FILE}: the draft has no weights.")
    model = SparrowDraftModel(cfg)
    missing, unexpected = model.load_state_dict(load_file(str(weights)), strict=False)
    if missing or unexpected:
        raise DraftConfigError(
            f"{weights} does not match its config.json: missing {missing}, unexpected {unexpected}"
        )
    return model.to(device=device, dtype=dtype).eval()


def is_sparrow_draft(path: str | None) -> bool:
    """True when `path` is a local directory whose config.json is a Sparrow draft's."""
    config = Path(path) / CONFIG_FILE if path else None
    if config is None or not config.is_file():
        return False
    try:
        return json.loads(config.read_text()).get("speculators_model_type") == SPECULATORS_MODEL_TYPE
    except (OSError, ValueError, AttributeError):
        return False  # not ours to judge: vLLM reports its own error for a broken config


def refuse_sparrow_draft_under(method: str | None, draft: str | None) -> None:
    """A Sparrow draft under another speculative method (or none, which vLLM reads as a plain
    draft model) would fail ~40 s later inside vLLM's model loader with a bare TypeError; say
    what to do instead, before anything loads."""
    if is_sparrow_draft(draft):
        under = f"the speculative method {method!r}" if method else "vLLM without a method (a plain draft model)"
        raise DraftConfigError(
            f"{draft!r} is a Sparrow draft (its config.json says speculators_model_type "
            f"'{SPECULATORS_MODEL_TYPE}'), which {under} cannot run. Use "
            f"--speculative-config '{{\"method\": \"sparrow\", \"model\": \"{draft}\"}}' "
            "(in Python: speculative_config={\"method\": \"sparrow\", \"model\": ...}).")


def check_depth(num_speculative_tokens: int, per_batch_size, draft_dir: str, recommended: int) -> None:
    """Draft depths outside 1..MAX_SPECULATIVE_TOKENS are refused at start-up, naming the
    draft's recommended depth (vLLM itself refuses 0 before this runs)."""
    asked = [("num_speculative_tokens", num_speculative_tokens)]
    asked += [(f"num_speculative_tokens_per_batch_size {tuple(e)}", e[2]) for e in per_batch_size or ()]
    for where, k in asked:
        if not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise DraftConfigError(
                f"{where}: a Sparrow draft drafts 1 to {MAX_SPECULATIVE_TOKENS} tokens per step, {k} was asked. "
                f"Leave num_speculative_tokens out to use the draft's recommended depth ({recommended}, "
                f"from {str(draft_dir)!r}'s config.json), or pick a depth in that range.")


def validate_draft_for_target(draft_dir: str | None, target_hf_config_or_model_config: Any) -> SparrowConfig:
    """Start-up checks with messages that say what to do. Returns the draft's config."""
    if not draft_dir:
        raise DraftConfigError(
            'speculative_config {"method": "sparrow"} needs "model": the Sparrow draft '
            "directory (create one with `sparrow init-draft --target TARGET --out DRAFT`)."
        )
    cfg = SparrowConfig.load(draft_dir)
    if not (Path(draft_dir) / WEIGHTS_FILE).is_file():
        raise DraftConfigError(f"{str(draft_dir)!r} has no {WEIGHTS_FILE}: the draft has no weights.")
    hf_config = getattr(target_hf_config_or_model_config, "hf_config", target_hf_config_or_model_config)
    target = target_spec(hf_config)  # raises UnsupportedTargetError
    if cfg.hidden_size != target.hidden_size:
        raise DraftConfigError(
            f"Sparrow draft {str(draft_dir)!r} reads hidden states of size {cfg.hidden_size}, but "
            f"the target ({target.architecture}) has hidden size {target.hidden_size}. Use a draft "
            "made for this target (`sparrow init-draft --target ...` or `sparrow train`)."
        )
    if cfg.vocab_size != target.vocab_size:
        raise DraftConfigError(
            f"Sparrow draft {str(draft_dir)!r} has vocabulary size {cfg.vocab_size}, but the target "
            f"has {target.vocab_size}. Draft and target must share a vocabulary."
        )
    _check_verifier(cfg, str(draft_dir), target, getattr(target_hf_config_or_model_config, "model", None))
    return cfg


def _check_verifier(cfg: SparrowConfig, draft_dir: str, target, target_path: str | None) -> None:
    """Refuse a draft made for another verifier (same sizes, other model: its drafts would all be
    rejected), as far as its config records: architecture, depth, weights fingerprint."""
    if envs.SPARROW_ALLOW_OTHER_VERIFIER:
        return
    diffs = []
    if cfg.verifier_architecture and cfg.verifier_architecture != target.architecture:
        diffs.append(f"architecture {cfg.verifier_architecture} (this target: {target.architecture})")
    if cfg.verifier_num_layers and cfg.verifier_num_layers != target.num_layers:
        diffs.append(f"{cfg.verifier_num_layers} layers (this target: {target.num_layers})")
    if cfg.verifier_weights and target_path:
        found = weights_fingerprint(target_path)
        if found is not None and found != cfg.verifier_weights:
            diffs.append(f"weights with fingerprint {cfg.verifier_weights} (this target's: {found})")
    if diffs:
        raise DraftConfigError(
            f"Sparrow draft {draft_dir!r} was made for another verifier ({cfg.verifier_name_or_path or 'unnamed'}): "
            f"{'; '.join(diffs)}. Its drafts would be rejected. Use a draft trained for this target "
            "(`sparrow capture` + `sparrow train`), or set SPARROW_ALLOW_OTHER_VERIFIER=1 to serve it anyway.")


def init_draft(target_dir: str | Path, out_dir: str | Path, *, anchor_tokens: int = SparrowConfig.anchor_tokens,
               window_tokens: int | None = SparrowConfig.window_tokens,
               speculative_tokens: int = SparrowConfig.speculative_tokens,
               ivsb_layer: int | None = None, seed: int = 0) -> Path:
    """Write a randomly initialised Sparrow draft shaped for the target at target_dir."""
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(str(target_dir))
    spec = target_spec(hf)
    cfg = SparrowConfig(
        **{**target_layer_shape(hf), "rope_theta": SparrowConfig.rope_theta},  # RoPE over text indices
        anchor_tokens=anchor_tokens,
        window_tokens=window_tokens,
        ivsb_layer=ivsb_layer if ivsb_layer is not None else (2 * spec.num_layers) // 3,
        verifier_name_or_path=str(target_dir),
        verifier_architecture=spec.architecture,
        verifier_num_layers=spec.num_layers,
        verifier_weights=weights_fingerprint(target_dir),
        speculative_tokens=speculative_tokens,
    )
    model = seeded_draft(SparrowDraftModel, cfg, seed)
    return save_draft(model, out_dir)


__all__ = ["DraftConfigError", "UnsupportedTargetError", "init_draft", "load_draft",
           "save_draft", "validate_draft_for_target"]
