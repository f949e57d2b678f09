"""`sparrow respond`: the target's own greedy answers to a training JSONL, written by vLLM.

Capture trains the draft on the target's own responses; writing them with transformers'
generate() one sample at a time is the slow half of a capture. Here vLLM's `LLM` writes them
(continuous batching, the video decoding serving uses, tensor parallelism through the engine
arguments) with the prompt and frames capture uses, so capture then stores these tokens as they
are (data.py reads "response_ids") instead of generating its own.

Output: one line per input line, same order, so line indices (the samples' ids) do not move:
  - a line that needs a response: the input object plus "response" (text) and "response_ids"
    (the target's tokens, ending with its end-of-turn token as HF generate ends it, unless cut
    at --max-new-tokens);
  - a line that has a response already (unless --regenerate), a bad line (data.parse_line gives
    BadSample: capture skips it later with its reason), a blank line, and a line whose media could
    not be decoded or that vLLM refused (logged, counted): copied through unchanged.
Kill-safe: each chunk's answers are appended durably to OUT's work file (STEM.work.jsonl beside
OUT; a torn last row from a kill is cut and its sample redone); OUT itself is written atomically
once every sample has its row. A rerun skips the samples the work file holds (rows are keyed by
line index and the line's hash, so an edited line is answered again); a rerun with nothing left
starts no engine. The work file is kept: it is what makes a finished rerun free.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..durable import append_jsonl, atomic_write_text, read_jsonl
from ..knobs import knob
from .data import BadSample, Sample, load_media, parse_line

log = logging.getLogger("vllm_sparrow.respond")


@dataclass
class RespondConfig:
    """`sparrow respond`: every option is a field here (knobs.py)."""

    target: str = knob(help="target model directory (Hugging Face format)")
    data: str = knob(help="JSONL of samples (see vllm_sparrow/training/data.py)")
    out: str = knob(help="output JSONL: the samples with the target's responses (rerun to resume)")
    num_frames: int = knob(16, "uniformly sampled frames per video (as capture's --frames)", flag="--frames")
    max_new_tokens: int = knob(256, "longest response the target writes (as capture's)")
    regenerate: bool = knob(False, "let the target rewrite responses the dataset has")
    retry_errors: bool = knob(False, "answer again the samples an earlier run could not (undecodable media, "
                                     "refused by vLLM)")
    chunk: int = knob(64, "samples handed to vLLM at once (each chunk is written when it finishes)")
    dtype: str = knob("float32", "the engine's dtype: float32 is the one capture runs the target in (so these are "
                                 "its tokens); bfloat16 is faster and writes what a bf16 server writes; auto: vLLM's "
                                 "choice", choices=("float32", "bfloat16", "float16", "auto"))
    tensor_parallel_size: int = knob(1, "GPUs per engine (vLLM's tensor parallelism)")
    limit: int | None = knob(None, "first N lines only")
    log: str = knob("", "where vLLM's own output goes (default: OUT.vllm.log; '-': the terminal)")
    engine_args: dict[str, Any] = knob(default_factory=dict, help='extra LLM(...) arguments as JSON, e.g. '
                                       '{"max_model_len": 32768, "gpu_memory_utilization": 0.8}')

    def settings(self) -> dict:
        """What the answers depend on: a work file written under others is not resumed."""
        from ..fingerprint import weights_fingerprint

        return {"target_weights": weights_fingerprint(self.target) or self.target, "dtype": self.dtype,
                "num_frames": self.num_frames, "max_new_tokens": self.max_new_tokens}


@dataclass
class RespondReport:
    responded: int  # answered this run
    failed: int  # media undecodable or refused by vLLM this run (copied through unchanged)
    resumed: int  # answered by an earlier run (the work file)
    kept: int  # lines with a response of their own, copied through
    bad: int  # BadSample lines, copied through (capture skips them with their reason)
    seconds: float  # answering, the engine's start-up not included
    output_tokens: int

    def summary(self) -> str:
        rate = f"; {self.responded / self.seconds:.2f} samples/s, " \
               f"{self.output_tokens / self.seconds:.1f} tokens/s" if self.responded and self.seconds else ""
        return (f"{self.responded} responded, {self.failed} failed, {self.resumed} from an earlier run, "
                f"{self.kept} kept their response, {self.bad} bad lines copied through{rate}")


class RespondRefused(ValueError):
    """The work file beside OUT was written with other settings, or OUT would overwrite the data."""


def work_file(out: str | Path) -> Path:
    """Where a run's answers go as they come: STEM.work.jsonl beside OUT."""
    out = Path(out)
    return out.with_name(f"{out.stem}.work.jsonl")


def respond(cfg: RespondConfig, llm=None, progress: bool = True, progress_file=None) -> RespondReport:
    """Write cfg.out; llm: an engine to use (default: one opened here, and shut down here, also on
    Ctrl-C: batch_caption.engine_session). Ctrl-C leaves as batch_caption.EngineInterrupted."""
    from ..batch_caption import engine_session

    lines = read_lines(cfg.data, cfg.limit)
    if Path(cfg.out).resolve() == Path(cfg.data).resolve():
        raise RespondRefused(f"--out {cfg.out} is the data file: write the responses beside it")
    work = work_file(cfg.out)
    samples, kept, bad = _plan(lines, Path(cfg.data).parent, cfg.regenerate)
    need = {s.index for s in samples}  # (a run with --regenerate may have answered others)
    answers = {i: a for i, a in _resumed_answers(work, cfg.settings(), lines).items()
               if i in need and not (cfg.retry_errors and "error" in a)}
    todo = [s for s in samples if s.index not in answers]
    counts = {"responded": 0, "failed": 0, "tokens": 0, "seconds": 0.0}
    if todo:  # nothing left: no engine
        with engine_session(lambda: _open(cfg), llm) as engine:
            _answer_all(engine, cfg, todo, lines, work, answers, counts, progress, progress_file)
    atomic_write_text(cfg.out, "".join(line + "\n" for line in merged_lines(lines, answers)))
    return RespondReport(counts["responded"], counts["failed"], len(samples) - len(todo), kept, bad,
                         counts["seconds"], counts["tokens"])


def read_lines(data: str | Path, limit: int | None = None) -> list[str]:
    """The data file's lines without their line ends, split as data.read_samples splits them
    (so list positions are the samples' indices)."""
    with open(data, encoding="utf-8") as f:
        lines = [line.rstrip("\r\n") for line in f]
    return lines if limit is None else lines[:limit]


def merged_lines(lines: list[str], answers: dict[int, dict]) -> list[str]:
    """Each line with its answer added ("response", "response_ids"), or as it was."""
    out = []
    for index, line in enumerate(lines):
        answer = answers.get(index)
        if answer is None or "response_ids" not in answer:
            out.append(line)
            continue
        row = json.loads(line)
        row["response"], row["response_ids"] = answer["response"], answer["response_ids"]
        out.append(json.dumps(row, ensure_ascii=False))
    return out


def _line_hash(line: str) -> str:
    return hashlib.sha256(line.encode()).hexdigest()[:16]


def _resumed_answers(work: Path, settings: dict, lines: list[str]) -> dict[int, dict]:
    """The work file's answers that still fit their line (index and hash); a new work file starts
    with the settings row. Refuses a work file of other settings."""
    rows = read_jsonl(work)  # cuts a row torn by a kill: its sample is answered again
    if not rows:
        append_jsonl(work, {"settings": settings})
        return {}
    if rows[0].get("settings") != settings:
        raise RespondRefused(f"{work} holds responses made with other settings ({rows[0].get('settings')} != "
                             f"{settings}); write to another --out, or delete {work} to start over")
    return {r["index"]: r for r in rows[1:]
            if 0 <= r.get("index", -1) < len(lines) and r.get("line") == _line_hash(lines[r["index"]])}


def _plan(lines: list[str], root: Path, regenerate: bool) -> tuple[list[Sample], int, int]:
    """(samples that need the target's answer, lines with a response kept, bad lines)."""
    samples, kept, bad = [], 0, 0
    for index, line in enumerate(lines):
        if not line.strip():
            continue
        sample = parse_line(index, line, root)
        if isinstance(sample, BadSample):
            bad += 1
            log.warning("copied through unchanged: %s", sample.message())
        elif (sample.response is not None or sample.response_ids is not None) and not regenerate:
            kept += 1
        else:
            samples.append(sample)
    return samples, kept, bad


def _open(cfg: RespondConfig):
    from transformers import AutoConfig

    from ..batch_caption import open_engine
    from ..targets import target_spec

    kw: dict[str, Any] = {"dtype": cfg.dtype, "tensor_parallel_size": cfg.tensor_parallel_size}
    if target_spec(AutoConfig.from_pretrained(cfg.target)).visual_token_ids:
        kw["limit_mm_per_prompt"] = {"video": 1, "image": 1}  # one medium per sample (data.py)
    return open_engine(cfg.target, {**kw, **cfg.engine_args})


def _answer_all(llm, cfg, todo, lines, work, answers, counts, progress, progress_file) -> None:
    from tqdm import tqdm

    params, templater = greedy_params(llm, cfg.max_new_tokens), templater_for(cfg.target)
    bar = tqdm(total=len(todo), desc="respond", unit="sample", disable=not progress, file=progress_file)
    start = time.perf_counter()
    try:
        for lo in range(0, len(todo), cfg.chunk):
            for row in _answer_chunk(llm, todo[lo : lo + cfg.chunk], cfg.num_frames, params, templater):
                row["line"] = _line_hash(lines[row["index"]])
                append_jsonl(work, row)
                answers[row["index"]] = row
                counts["failed" if "error" in row else "responded"] += 1
                counts["tokens"] += len(row.get("response_ids", ()))
                bar.update(1)
    finally:
        bar.close()
        counts["seconds"] = time.perf_counter() - start


def greedy_params(llm, max_new_tokens: int):
    """Greedy decoding as HF generate(do_sample=False) does it with the target's generation
    config: its repetition penalty applies there (Qwen2.5-VL's is 1.05), so it applies here."""
    from vllm import SamplingParams

    penalty = llm.get_default_sampling_params().repetition_penalty
    return SamplingParams(temperature=0.0, max_tokens=max_new_tokens, repetition_penalty=penalty)


def templater_for(target: str):
    """sample -> the chat prompt string vLLM gets for it (media first, as capture builds it)."""
    from transformers import AutoProcessor

    from ..prompts import chat_prompt

    proc = AutoProcessor.from_pretrained(target)  # a tokenizer for a text-only target
    return lambda sample: chat_prompt(proc, sample.prompt, sample.media_kind)


def _answer_chunk(llm, samples: list[Sample], num_frames: int, params, templater) -> list[dict]:
    """One row per sample: {"index", "response", "response_ids"} or {"index", "error"}."""
    from ..batch_caption import generate_each

    rows, requests = [], []
    for sample in samples:
        try:
            media = load_media(sample, num_frames)
        except ValueError as e:  # corrupt media: capture skips the line later with its reason
            rows.append(_failed(sample.index, str(e)))
            continue
        request: dict[str, Any] = {"prompt": templater(sample)}
        if sample.media_kind is not None:
            request["multi_modal_data"] = {sample.media_kind: media}
        requests.append((sample.index, request))
    for (index, _), out in zip(requests, generate_each(llm, [r for _, r in requests], params)):
        if isinstance(out, Exception):  # e.g. longer than the engine's max_model_len
            rows.append(_failed(index, str(out)))
        else:
            rows.append({"index": index, "response": out.outputs[0].text,
                         "response_ids": list(out.outputs[0].token_ids)})
    return rows


def _failed(index: int, error: str) -> dict:
    log.warning("sample %d copied through without a response: %s", index, error)
    return {"index": index, "error": error}
