"""Export a training run's latest checkpoint as a plugin draft directory (config.json +
model.safetensors), loadable by `LLM(..., speculative_config={"method": "sparrow", ...})`, or,
for an EAGLE-baseline run, in vLLM's `eagle` format (`"method": "eagle"`). The IVSB bridge is
training-only and is left out."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..checkpoint import load_draft, save_draft


def export_run(run_dir: str | Path, out_dir: str | Path) -> Path:
    run = Path(run_dir)
    ckpt_path = run / "checkpoint.pt"
    if not ckpt_path.is_file():
        raise FileNotFoundError(f"{run}: no checkpoint.pt yet; train for at least --save-every steps")
    cfg = json.loads((run / "train_config.json").read_text())
    init = Path(cfg["init"]) if cfg.get("init") else run / "init"
    weights = torch.load(ckpt_path, weights_only=False)["draft"]
    if cfg.get("draft_kind") == "eagle":
        from .eagle_baseline import EagleBaselineDraft

        baseline = EagleBaselineDraft.load(init)
        baseline.load_state_dict(weights)
        return baseline.save(out_dir)
    draft = load_draft(init)
    draft.load_state_dict(weights)
    draft.cfg.speculative_tokens = cfg["speculative_tokens"]
    return save_draft(draft, out_dir)
