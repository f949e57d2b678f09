"""`sparrow capture`: run the target over a dataset and store what Sparrow's training reads.

Per kept sample (see shards.py for the directory layout):
  token_ids      [n]            prompt (visual placeholders expanded) + response
  is_visual      [n] bool       visual placeholder positions
  prompt_len     [1]            tokens before the response
  text_hidden    [n_text, H]    target final-layer states (after the final norm) at text positions
  visual_hidden  [n_vis, H]     target layer-`ivsb_layer` states at visual positions (IVSB)
with `eagle_baseline` also (for the EAGLE-style baseline draft, which reads every position):
  visual_final   [n_vis, H]     target final-layer states at visual positions
  positions      [n]            rotary positions vLLM hands a 1-D-RoPE EAGLE draft
Responses come from the target itself (greedy) when the sample has none or `regenerate` is set,
so the draft learns the target's own distribution. Bad samples are skipped, counted and kept
in the manifest with their reason; the run goes on.

States are stored in bfloat16 by default: a 25k-token clip's IVSB states for a 7B target are
25,000 x 3,584 x 2 B = 179 MB a sample (twice that in float32). Before the first sample the
capture prints its estimate of the bytes per sample and for the run, and refuses, with the
numbers, when the disk cannot hold them. `--shard I/N` splits a capture over N processes
(shards.py).
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..knobs import knob
from ..durable import DurableWriteError
from ..fingerprint import weights_fingerprint
from .data import BadSample, Sample, load_media, read_samples
from .shards import CaptureMismatch, Part, ShardWriter, check_data_file, open_part
from .target_runner import eagle3_layer_ids

log = logging.getLogger("vllm_sparrow.capture")
STORE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class CaptureConfig:
    """`sparrow capture`: every option is a field here (knobs.py)."""

    target: str = knob(help="target model directory (Hugging Face format)")
    data: str = knob(help="JSONL of samples (see vllm_sparrow/training/data.py)")
    out: str = knob(help="capture directory (rerun to resume)")
    ivsb_layer: int | None = knob(None, "target layer of the IVSB visual states (omit: two thirds of the "
                                        "depth; `sparrow probe-layers` suggests one)")
    num_frames: int = knob(16, "uniformly sampled frames per video", flag="--frames")
    regenerate: bool = knob(False, "let the target rewrite responses the dataset has")
    max_new_tokens: int = knob(256, "longest response the target writes")
    max_seq_len: int = knob(16384, "longer samples are skipped")
    shard_size: int = knob(64, "samples per shard (memory is bounded by one shard)")
    store_dtype: str = knob("bfloat16", "dtype of the stored states", choices=("float32", "bfloat16", "float16"))
    device: str = knob("cpu", "torch device of the target")
    limit: int | None = knob(None, "first N lines only")
    eagle_baseline: bool = knob(False, "also store what the EAGLE-style baseline trains on")
    eagle3: bool = knob(False, "also store the EAGLE-3 auxiliary states (the target layers vLLM hands an "
                               "eagle3 draft)")
    shard: str | None = knob(None, "I/N: capture only the samples whose line index is I modulo N, into the same "
                                   "directory as the other N - 1 processes (one per GPU or machine)")
    disk_check: bool = knob(True, "refuse to start when the estimated size exceeds the free disk",
                            flag="--no-disk-check")

    def settings(self) -> dict:
        """What must not change between a run and its resumption, the target's weights included
        (a retrained target at the same path must not extend a capture of its old self)."""
        keep = ("target", "data", "ivsb_layer", "num_frames", "regenerate", "max_new_tokens",
                "max_seq_len", "store_dtype", "eagle_baseline")
        extra = {"eagle3": True} if self.eagle3 else {}  # (absent when off: older captures resume)
        return {**{k: v for k, v in asdict(self).items() if k in keep}, **extra,
                "target_weights": weights_fingerprint(self.target)}


@dataclass
class CaptureReport:
    kept: int  # this process's part of a split capture
    skipped: dict[str, int]  # reason -> count
    resumed_from: int  # samples already done before this run

    def summary(self) -> str:
        bad = ", ".join(f"{n} {r}" for r, n in sorted(self.skipped.items())) or "none"
        return f"kept {self.kept} samples; skipped: {bad}"


def capture(cfg: CaptureConfig, progress: bool = True) -> CaptureReport:
    from tqdm import tqdm

    from .target_runner import HFTarget

    target = HFTarget(cfg.target, device=cfg.device)
    if cfg.ivsb_layer is None:
        cfg.ivsb_layer = max(1, (2 * target.num_layers) // 3)
    if not 1 <= cfg.ivsb_layer <= target.num_layers:
        raise ValueError(f"ivsb_layer must be in 1..{target.num_layers} for this target, got {cfg.ivsb_layer}")
    out = Path(cfg.out)
    part = None if cfg.shard is None else Part.parse(cfg.shard)
    folder, manifest = open_part(out, cfg.settings(), part)
    check_data_file(manifest, cfg.data, folder)
    done = manifest.done()
    writer = ShardWriter(folder, manifest, cfg.shard_size)
    rows = [r for r in read_samples(cfg.data) if (cfg.limit is None or r.index < cfg.limit)
            and (part is None or part.owns(r.index))]
    todo = [r for r in rows if r.index not in done]
    check_disk(cfg, target, todo, folder)
    bar = tqdm(todo, desc="capture", unit="sample", disable=not progress)
    for row in bar:
        problem = row if isinstance(row, BadSample) else _capture_one(target, row, cfg, writer)
        if problem is not None:
            writer.skip(problem.index, f"{problem.reason}: {problem.detail}")
            log.warning("skipped %s", problem.message())
        bar.set_postfix(kept=len(manifest.samples()) + len(writer.buffer), skipped=len(manifest.skipped))
    writer.flush()
    counts: dict[str, int] = {}
    for message in manifest.skipped.values():
        reason = message.split(":", 1)[0]
        counts[reason] = counts.get(reason, 0) + 1
    report = CaptureReport(len(manifest.samples()), counts, len(done))
    log.info("capture %s: %s", out, report.summary())
    return report


class CaptureRefused(CaptureMismatch):
    """The capture would not fit on its disk (or similar): nothing was written."""


def check_disk(cfg: CaptureConfig, target, todo: list, folder: Path) -> None:
    """Print the estimated bytes per sample and for the samples left; refuse when the free space
    of the capture's disk is smaller (estimated from the first sample that encodes)."""
    first = next((r for r in todo if not isinstance(r, BadSample)), None)
    if first is None:
        return
    try:
        per_sample, basis = estimate_sample_bytes(cfg, target, first)
    except Exception as e:  # noqa: BLE001 - the sample's own problem is reported when it is captured
        log.info("no size estimate: sample %d does not encode (%s)", first.index, e)
        return
    total, free = per_sample * len(todo), shutil.disk_usage(folder).free
    print(f"capture: about {size(per_sample)} a sample ({basis}), {size(total)} for {len(todo)} samples; "
          f"{size(free)} free at {folder}", flush=True)
    if cfg.disk_check and total > free:
        raise CaptureRefused(
            f"{folder}: the capture needs about {size(total)} and the disk has {size(free)} free. Free space, capture elsewhere (--out), split it (--shard I/N on other machines), store "
            "fewer frames (--frames) or, if the estimate is too high, pass --no-disk-check")


def size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.1f} {unit}"
        n /= 1024


def estimate_sample_bytes(cfg: CaptureConfig, target, sample: Sample) -> tuple[int, str]:
    """Bytes one sample like `sample` stores, and what the estimate rests on (its prompt's
    visual and text tokens; its response, or max_new_tokens when the target writes it)."""
    inputs = target.encode(sample.prompt, sample.media_kind, load_media(sample, cfg.num_frames))
    ids = inputs["input_ids"][0]
    n_vis = int(torch.isin(ids, torch.tensor(target.spec.visual_token_ids, dtype=ids.dtype)).sum())
    if sample.response_ids is not None and not cfg.regenerate:
        response, said = len(sample.response_ids), "its response"
    else:
        response, said = cfg.max_new_tokens, "responses up to --max-new-tokens"
    n = ids.shape[0] + response
    width = target.spec.hidden_size * STORE_DTYPES[cfg.store_dtype].itemsize
    states = (n - n_vis) + n_vis  # text states (final layer) + IVSB states (layer L)
    states += n_vis if cfg.eagle_baseline else 0  # final states at visual positions
    aux = len(eagle3_layer_ids(target.num_layers)) if cfg.eagle3 else 0
    states += n * aux
    # token ids and is_visual per position, prompt_len, (EAGLE) positions, (EAGLE-3) layer ids
    ids_bytes = n * (8 + 1) + 8 + (8 * n if cfg.eagle_baseline else 0) + 8 * aux
    return states * width + ids_bytes, f"sample {sample.index}: {n_vis:,} visual + {n - n_vis:,} text tokens, {said}"


def _capture_one(target, sample: Sample, cfg: CaptureConfig, writer: ShardWriter) -> BadSample | None:
    """Capture one sample, or say why not: any failure of this sample (its media, the processor,
    the target) skips it with its reason; the run goes on and a rerun does not retry it."""
    try:
        return _capture_sample(target, sample, cfg, writer)
    except DurableWriteError:  # the disk, not the sample: stop (a rerun resumes)
        raise
    except Exception as e:  # noqa: BLE001 - one sample never stops a capture
        log.debug("sample %d failed", sample.index, exc_info=True)
        return BadSample(sample.index, "target error", f"{type(e).__name__}: {e}")


def _capture_sample(target, sample: Sample, cfg: CaptureConfig, writer: ShardWriter) -> BadSample | None:
    try:
        media = load_media(sample, cfg.num_frames)
    except ValueError as e:  # missing/corrupt media (VideoDecodeError is a ValueError)
        return BadSample(sample.index, "undecodable media", str(e))
    inputs = target.encode(sample.prompt, sample.media_kind, media)
    prompt_len = inputs["input_ids"].shape[1]
    if prompt_len >= cfg.max_seq_len:
        return BadSample(sample.index, "over-long sample",
                         f"{prompt_len} prompt tokens >= max_seq_len {cfg.max_seq_len}; use fewer frames")
    if (sample.response is None and sample.response_ids is None) or cfg.regenerate:
        response = target.answer(inputs, min(cfg.max_new_tokens, cfg.max_seq_len - prompt_len))
    elif sample.response_ids is not None:  # the target's own tokens (sparrow respond)
        response = list(sample.response_ids)
    else:
        response = target.response_ids(sample.response)
    if not response:
        return BadSample(sample.index, "empty response", "the target produced no tokens")
    if prompt_len + len(response) > cfg.max_seq_len:
        return BadSample(sample.index, "over-long sample",
                         f"{prompt_len + len(response)} tokens > max_seq_len {cfg.max_seq_len}")
    aux_layers = eagle3_layer_ids(target.num_layers) if cfg.eagle3 else ()
    token_ids, final, layer, full, aux = target.states(inputs, response, cfg.ivsb_layer, aux_layers)
    is_visual = torch.isin(token_ids, torch.tensor(target.spec.visual_token_ids, dtype=token_ids.dtype))
    is_visual[prompt_len:] = False  # generated tokens are text whatever their id
    dtype = STORE_DTYPES[cfg.store_dtype]
    tensors = {
        "token_ids": token_ids.long(),  # [n]
        "is_visual": is_visual,  # [n]
        "prompt_len": torch.tensor([prompt_len]),
        "text_hidden": final[~is_visual].to(dtype),  # [n_text, H]
        "visual_hidden": layer[is_visual].to(dtype),  # [n_vis, H]
    }
    if cfg.eagle_baseline:
        tensors["visual_final"] = final[is_visual].to(dtype)  # [n_vis, H]
        tensors["positions"] = target.eagle_positions(full).long()  # [n]
    if cfg.eagle3:  # every position, visual ones included, as vLLM hands them to the draft
        tensors["aux_hidden"] = aux.to(dtype)  # [n, A * H]
        tensors["aux_layers"] = torch.tensor(aux_layers)  # [A]
    writer.add(sample.index, tensors)
    return None
