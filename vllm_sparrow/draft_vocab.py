"""A reduced draft vocabulary: the draft proposes only among the N target tokens most frequent in
its training capture (the idea behind vLLM's EAGLE-3 `d2t` map).

Why: with a shared 152k-token LM head, the head is most of a 7B-wide draft step's FLOPs; N = 32k
cuts it ~5x. It stays exact: greedy drafts are whatever the draft proposes (the target verifies
them), and probabilistic drafts put q = 0 outside the subset, which rejection sampling handles
like any other draft distribution.

Stored beside the draft's weights as draft_vocab.safetensors ({"ids": int64 [N], ascending target
ids}); `sparrow export --draft-vocab N` writes it from the run's capture (training samples only),
and the plugin uses it whenever it is there (SPARROW_DRAFT_VOCAB=full ignores it).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from . import envs

VOCAB_FILE = "draft_vocab.safetensors"


def count_text_tokens(capture_dir: str | Path, samples: int | None = None) -> np.ndarray:
    """How often each token id occurs as text (visual placeholders excluded) in the first
    `samples` captured samples (all by default). Reads only token ids, not hidden states."""
    capture = Path(capture_dir)
    manifest = json.loads((capture / "manifest.json").read_text())
    counts = np.zeros(0, dtype=np.int64)
    seen = 0
    for shard in manifest["shards"]:
        with safe_open(str(capture / shard["file"]), framework="pt") as f:
            for index in shard["samples"]:
                if samples is not None and seen >= samples:
                    return counts
                ids = f.get_tensor(f"{index}/token_ids").numpy()
                ids = ids[~f.get_tensor(f"{index}/is_visual").numpy().astype(bool)]
                c = np.bincount(ids)
                if c.shape[0] > counts.shape[0]:
                    counts = np.pad(counts, (0, c.shape[0] - counts.shape[0]))
                counts[: c.shape[0]] += c
                seen += 1
    return counts


def top_tokens(counts: np.ndarray, n: int, vocab_size: int) -> torch.Tensor:
    """[min(n, vocab_size)] ascending ids: the n most frequent (ties: lower id), topped up with
    the lowest unseen ids when fewer than n were seen."""
    if n < 1:
        raise ValueError(f"draft vocabulary size must be >= 1, got {n}")
    full = np.zeros(vocab_size, dtype=np.int64)
    full[: min(vocab_size, counts.shape[0])] = counts[:vocab_size]
    order = np.lexsort((np.arange(vocab_size), -full))  # by count desc, then id asc
    return torch.from_numpy(np.sort(order[: min(n, vocab_size)]).astype(np.int64))


def save_vocab(draft_dir: str | Path, ids: torch.Tensor) -> Path:
    path = Path(draft_dir) / VOCAB_FILE
    tmp = path.with_suffix(".tmp")
    save_file({"ids": ids.long().contiguous()}, str(tmp))
    os.replace(tmp, path)
    return path


def load_vocab(draft_dir: str | Path) -> torch.Tensor | None:
    """The draft's token subset [N], or None (full vocabulary; or SPARROW_DRAFT_VOCAB=full)."""
    path = Path(draft_dir) / VOCAB_FILE
    if envs.SPARROW_DRAFT_VOCAB == "full" or not path.exists():
        return None
    ids = load_file(str(path))["ids"].long()
    if ids.ndim != 1 or ids.numel() == 0 or bool((ids[1:] <= ids[:-1]).any()):
        raise ValueError(f"{path}: 'ids' must be a non-empty ascending list of token ids")
    return ids


class SubsetLogits:
    """TokenIO whose logits are the LM head's rows for the subset only: [N, hidden] gathered once.

    logits(hidden [B, H]) -> [B, N]; column j is target token ids[j]. Valid for an LM head that
    is a plain matmul (no bias, scale or soft cap): checked by the caller."""

    def __init__(self, io, ids: torch.Tensor, head_weight: torch.Tensor, vocab_size: int) -> None:
        if int(ids.max()) >= min(vocab_size, head_weight.shape[0]):
            raise ValueError(f"draft vocabulary holds id {int(ids.max())}, the target's vocabulary has {vocab_size}")
        self.io = io
        self.ids = ids.to(head_weight.device)
        self.weight_t = head_weight.detach()[self.ids].T.contiguous()  # [H, N]
        self.vocab_size = vocab_size

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.io.embed(token_ids)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden.to(self.weight_t.dtype) @ self.weight_t
