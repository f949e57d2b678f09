"""`sparrow capture`: run the target over a dataset and store what Sparrow's training reads.

Per kept sample (see shards.py for the directory layout):
  token_ids      [n]            prompt (visual placeholders expanded) + response
  is_visual      [n] bool       visual placeholder positions
  prompt_len     [1]            tokens before the response
  text_hidden    [n_text, H]    target final-layer states (after the final norm) at text positions
  visual_hidden  [n_vis, H]     target layer-`ivsb_layer` states at visual positions (IVSB); with
                                --ivsb-keep F < 1 only a share F of them, and beside it
  visual_kept    [n_kept]       which visual positions those are (indices among the visual ones)
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
(shards.py). The command's `--engine --ray ADDRESS --replicas N` form runs the same capture (its
settings, resume, manifest and disk check are this module's) with a runner of its own that hands
the samples to engine replicas of a Ray cluster: capture(cfg, runner=...); nothing here knows of Ray.
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from ..knobs import knob
from ..durable import DurableWriteError
from ..fingerprint import weights_fingerprint
from .data import BadSample, Sample, load_media, read_samples
from .shards import CaptureMismatch, Part, ShardWriter, check_data_file, open_part
from .stored import STORE_DTYPES, given_response, ivsb_kept, stored_tensors
from .target_runner import eagle3_layer_ids

log = logging.getLogger("vllm_sparrow.capture")


@dataclass
class CaptureConfig:
    """`sparrow capture`: every option of the capture is a field here (knobs.py); the command's
    cluster options (--ray, --replicas, ...) are its own, beside this config."""

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
    ivsb_keep: float = knob(1.0, "share of a sample's visual positions whose IVSB states are stored (a random "
                                 "set fixed by its line index): those states are most of a capture's bytes")
    shard: str | None = knob(None, "I/N: capture only the samples whose line index is I modulo N, into the same "
                                   "directory as the other N - 1 processes (one per GPU or machine)")
    disk_check: bool = knob(True, "(--no-disk-check: start even when the estimated size exceeds the free disk)",
                            flag="--no-disk-check")
    engine: bool = knob(False, "run the target in vLLM: many samples per batched prefill, responses written "
                               "by vLLM (else transformers, one sample at a time)")
    batch: int = knob(16, "samples per engine run (--engine)")
    engine_args: dict[str, Any] = knob(default_factory=dict, help='extra LLM(...) arguments of the --engine '
                                       'target as JSON, e.g. {"tensor_parallel_size": 2, "dtype": "bfloat16"}')

    def settings(self) -> dict:
        """What must not change between a run and its resumption, the target's weights included
        (a retrained target at the same path must not extend a capture of its old self)."""
        keep = ("target", "data", "ivsb_layer", "num_frames", "regenerate", "max_new_tokens",
                "max_seq_len", "store_dtype", "eagle_baseline")
        extra = {"eagle3": True} if self.eagle3 else {}  # (absent when off: older captures resume)
        if self.ivsb_keep < 1.0:
            extra["ivsb_keep"] = self.ivsb_keep
        return {**{k: v for k, v in asdict(self).items() if k in keep}, **extra,
                "target_weights": weights_fingerprint(self.target)}


@dataclass
class CaptureReport:
    kept: int  # this process's part of a split capture
    skipped: dict[str, int]  # reason -> count
    resumed_from: int  # samples already done before this run
    seconds: float = 0.0  # the sample loop's wall time this run (the model's or engine's start-up excluded)

    def summary(self) -> str:
        bad = ", ".join(f"{n} {r}" for r, n in sorted(self.skipped.items())) or "none"
        return f"kept {self.kept} samples; skipped: {bad}"


# What captures the samples left: (cfg, target, todo, writer, progress) -> the seconds of its sample
# loop. target: the HFTarget, or with --engine the TargetInputs (the prompt side an engine runner
# starts its engine from); todo: the Sample or BadSample rows to capture, in order; each result
# goes to writer (ShardWriter.add / .skip, or .add_written for a shard written elsewhere).
CaptureRunner = Callable[[CaptureConfig, Any, list, ShardWriter, bool], float]


def capture(cfg: CaptureConfig, progress: bool = True, runner: CaptureRunner | None = None) -> CaptureReport:
    """Capture cfg.data's samples not in cfg.out yet. runner: what captures them (default: the
    transformers target one sample at a time, or with --engine one vLLM engine here); the settings,
    resume, data-file and disk checks and the report are this function's whichever runs them."""
    from .target_runner import HFTarget, TargetInputs

    target = TargetInputs(cfg.target) if cfg.engine else HFTarget(cfg.target, device=cfg.device)
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
    run = runner or (_run_engine if cfg.engine else _run_hf)
    seconds = run(cfg, target, todo, writer, progress) if todo else 0.0
    writer.flush()
    counts: dict[str, int] = {}
    for message in manifest.skipped.values():
        reason = message.split(":", 1)[0]
        counts[reason] = counts.get(reason, 0) + 1
    report = CaptureReport(len(manifest.samples()), counts, len(done), seconds)
    log.info("capture %s: %s", out, report.summary())
    return report


def _record(writer: ShardWriter, index: int, result: dict | BadSample) -> None:
    if isinstance(result, BadSample):
        writer.skip(result.index, f"{result.reason}: {result.detail}")
        log.warning("skipped %s", result.message())
    else:
        writer.add(index, result)


def _progress(total: int, progress: bool, writer: ShardWriter):
    from tqdm import tqdm

    bar = tqdm(total=total, desc="capture", unit="sample", disable=not progress)
    m = writer.manifest
    return bar, lambda n: (bar.update(n), bar.set_postfix(kept=len(m.samples()) + len(writer.buffer),
                                                          skipped=len(m.skipped)))


def _run_hf(cfg: CaptureConfig, target, todo: list, writer: ShardWriter, progress: bool) -> float:
    """The transformers target, one sample at a time (the reference path). Returns its seconds."""
    bar, advance = _progress(len(todo), progress, writer)
    start = time.perf_counter()
    for row in todo:
        _record(writer, row.index, row if isinstance(row, BadSample) else capture_one(target, row, cfg))
        advance(1)
    bar.close()
    return time.perf_counter() - start


def _run_engine(cfg: CaptureConfig, inputs, todo: list, writer: ShardWriter, progress: bool) -> float:
    """The vLLM target, `cfg.batch` samples per engine run (engine_target.py). Returns the seconds
    of its sample loop (the engine's start-up excluded)."""
    from ..batch_caption import engine_session, open_engine
    from .engine_target import EngineTarget, engine_args, engine_chunk

    bar, advance = _progress(len(todo), progress, writer)
    args = engine_args(cfg.max_seq_len, inputs.max_positions, cfg.engine_args)
    with engine_session(lambda: open_engine(cfg.target, args)) as llm:
        target = EngineTarget(cfg.target, llm, inputs)
        start = time.perf_counter()
        try:
            for lo in range(0, len(todo), cfg.batch):
                chunk = todo[lo: lo + cfg.batch]
                for row, result in zip(chunk, engine_chunk(target, chunk, cfg)):
                    _record(writer, row.index, result)
                advance(len(chunk))
        finally:
            target.close()
        seconds = time.perf_counter() - start
    bar.close()
    return seconds


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
    kept = ivsb_kept(n_vis, cfg.ivsb_keep, sample.index)
    n_kept = n_vis if kept is None else len(kept)
    states = (n - n_vis) + n_kept  # text states (final layer) + IVSB states (layer L)
    states += n_vis if cfg.eagle_baseline else 0  # final states at visual positions
    aux = len(eagle3_layer_ids(target.num_layers)) if cfg.eagle3 else 0
    states += n * aux
    # token ids and is_visual per position, prompt_len, (EAGLE) positions, (EAGLE-3) layer ids
    ids_bytes = n * (8 + 1) + 8 + (8 * n if cfg.eagle_baseline else 0) + 8 * aux + (0 if kept is None else 8 * n_kept)
    return states * width + ids_bytes, f"sample {sample.index}: {n_vis:,} visual + {n - n_vis:,} text tokens, {said}"


def capture_one(target, sample: Sample, cfg: CaptureConfig) -> dict | BadSample:
    """One sample's tensors, or why not: any failure of this sample (its media, the processor,
    the target) skips it with its reason; the run goes on and a rerun does not retry it."""
    try:
        return _capture_sample(target, sample, cfg)
    except DurableWriteError:  # the disk, not the sample: stop (a rerun resumes)
        raise
    except Exception as e:  # noqa: BLE001 - one sample never stops a capture
        log.debug("sample %d failed", sample.index, exc_info=True)
        return BadSample(sample.index, "target error", f"{type(e).__name__}: {e}")


def _capture_sample(target, sample: Sample, cfg: CaptureConfig) -> dict | BadSample:
    try:
        media = load_media(sample, cfg.num_frames)
    except ValueError as e:  # missing/corrupt media (VideoDecodeError is a ValueError)
        return BadSample(sample.index, "undecodable media", str(e))
    inputs = target.encode(sample.prompt, sample.media_kind, media)
    prompt_len = inputs["input_ids"].shape[1]
    if prompt_len >= cfg.max_seq_len:
        return BadSample(sample.index, "over-long sample",
                         f"{prompt_len} prompt tokens >= max_seq_len {cfg.max_seq_len}; use fewer frames")
    response = given_response(target, sample, cfg)
    if response is None:
        response = target.answer(inputs, min(cfg.max_new_tokens, cfg.max_seq_len - prompt_len))
    if not response:
        return BadSample(sample.index, "empty response", "the target produced no tokens")
    if prompt_len + len(response) > cfg.max_seq_len:
        return BadSample(sample.index, "over-long sample",
                         f"{prompt_len + len(response)} tokens > max_seq_len {cfg.max_seq_len}")
    aux_layers = eagle3_layer_ids(target.num_layers) if cfg.eagle3 else ()
    token_ids, final, layer, full, aux = target.states(inputs, response, cfg.ivsb_layer, aux_layers)
    tensors = stored_tensors(cfg, sample.index, target.spec.visual_token_ids, token_ids, prompt_len, final, layer, aux,
                             aux_layers)
    if cfg.eagle_baseline:
        tensors["visual_final"] = final[tensors["is_visual"]].to(STORE_DTYPES[cfg.store_dtype])  # [n_vis, H]
        tensors["positions"] = target.eagle_positions(full).long()  # [n]
    return tensors
