"""Export a training run's latest checkpoint in the format vLLM serves its kind in (recipes.py):
a Sparrow plugin draft (`"method": "sparrow"`), or vLLM's own `eagle` / `eagle3` formats for the
baselines. The IVSB bridge is training-only and is left out."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from ..knobs import knob
from .recipes import recipe_for


@dataclass
class ExportJob:
    """`sparrow export`: every option is a field here (knobs.py)."""

    run: str = knob(help="run directory of `sparrow train` (its last checkpoint is exported)")
    out: str = knob(help="draft directory to write")
    draft_vocab: int | None = knob(None, "also write a reduced draft vocabulary: the N most frequent text tokens of "
                                         "the run's training capture (the draft proposes only those; lossless "
                                         "either way)")


def export_run(run_dir: str | Path, out_dir: str | Path, draft_vocab: int | None = None) -> Path:
    """draft_vocab: also write a reduced draft vocabulary of that many tokens, the most frequent
    text tokens of the run's training samples (draft_vocab.py)."""
    run = Path(run_dir)
    ckpt_path = run / "checkpoint.pt"
    if not run.is_dir():
        raise FileNotFoundError(f"{run}: no such run directory (--run is the --out of `sparrow train`)")
    if not ckpt_path.is_file():
        raise FileNotFoundError(f"{run}: no checkpoint.pt yet; train for at least --save-every steps")
    cfg = json.loads((run / "train_config.json").read_text())
    init = Path(cfg["init"]) if cfg.get("init") else run / "init"
    weights = torch.load(ckpt_path, weights_only=False, map_location="cpu")["draft"]
    kind = cfg.get("draft_kind", "sparrow")
    if kind != "sparrow" and draft_vocab is not None:
        raise ValueError("--draft-vocab is for Sparrow drafts; train an eagle3 draft over a reduced vocabulary "
                         "instead (vLLM's eagle method reads the full one)")
    recipe = recipe_for(kind)
    from types import SimpleNamespace

    from .train import recorded_depth

    # The depth asked for at training, else the one its final validation chose (else the init's).
    depth = cfg.get("speculative_tokens") or recorded_depth(run)
    draft = recipe.load(init, SimpleNamespace(device="cpu", speculative_tokens=depth))
    draft.load_state_dict(weights)
    out = recipe.save(draft, out_dir, cfg)
    if kind != "sparrow":
        return out
    from ..draft_vocab import VOCAB_FILE

    (out / VOCAB_FILE).unlink(missing_ok=True)  # an earlier export's subset must not outlive it
    if draft_vocab is not None:
        from ..draft_vocab import count_text_tokens, save_vocab, top_tokens
        from .shards import ShardReader

        if not cfg.get("capture"):  # an --online run stored no capture to count tokens in
            raise ValueError(f"{run} trained --online: a reduced draft vocabulary counts the tokens of a "
                             "capture; export without --draft-vocab, or capture the data and export from that")
        training = len(ShardReader(cfg["capture"])) - int(cfg.get("holdout", 0))  # held-out clips stay unseen
        counts = count_text_tokens(cfg["capture"], samples=max(training, 1))
        save_vocab(out, top_tokens(counts, draft_vocab, draft.cfg.vocab_size))
    return out
