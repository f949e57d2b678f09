"""`sparrow train --online`: the target's states computed inside the training loop, never stored.

For videos long enough that a capture would not fit on disk (a 25k-token clip's IVSB states are
179 MB in bfloat16 for a 7B target), the training's own target (on the training device, on every
rank under torchrun) runs each sample when the loop reaches it: OnlineSamples offers what
ShardReader offers (len, sample by position, the settings), computed by the same code that
capture stores from (capture.capture_one, in float32), so the same samples train to the same
losses as from a float32 capture of them. Positions are the data file's good lines in order.
A response the target writes (a sample without one) is generated once and kept for later
epochs; `sparrow respond` writes them ahead in one batched engine run.
"""

from __future__ import annotations

import dataclasses
import logging
from types import SimpleNamespace

from .capture import CaptureConfig, capture_one
from .data import BadSample, read_samples
from .recipes import recipe_for

log = logging.getLogger("vllm_sparrow.train")


class OnlineSampleError(ValueError):
    """A sample that cannot train (its media, its length): the loop skips it, as a damaged shard."""


class OnlineSamples:
    def __init__(self, cfg, target) -> None:
        flag = recipe_for(cfg.draft_kind).capture_flag
        self.capture = CaptureConfig(
            target=cfg.target, data=cfg.data, out="", num_frames=cfg.num_frames, max_new_tokens=cfg.max_new_tokens,
            max_seq_len=cfg.max_seq_len, store_dtype="float32", ivsb_layer=cfg.ivsb_layer or
            max(1, (2 * target.num_layers) // 3), **({flag: True} if flag else {}))
        self.target = target
        rows = list(read_samples(cfg.data))
        for bad in (r for r in rows if isinstance(r, BadSample)):
            log.warning("skipped %s", bad.message())
        self.samples = [r for r in rows if not isinstance(r, BadSample)]
        self.manifest = SimpleNamespace(settings={"target": cfg.target, **({flag: True} if flag else {})})
        self.written: dict[int, tuple[int, ...]] = {}  # sample index -> the response the target wrote

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, pos: int) -> dict:
        sample = self.samples[pos]
        if sample.index in self.written:
            sample = dataclasses.replace(sample, response_ids=self.written[sample.index])
        result = capture_one(self.target, sample, self.capture)
        if isinstance(result, BadSample):
            raise OnlineSampleError(result.message())
        if sample.response is None and sample.response_ids is None:
            self.written[sample.index] = tuple(result["token_ids"][int(result["prompt_len"]):].tolist())
        return result
