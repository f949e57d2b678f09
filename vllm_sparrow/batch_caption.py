"""Offline batch captioning with vLLM's `LLM` (Sparrow on when a draft is given).

Input: a folder of videos (id: the file name), or a listing of {"video": path, "prompt"?: str,
"id"?: str} as JSONL lines or Parquet rows (.parquet; pyarrow, which the [ray] extra brings) (id:
the video path as written, unless given; ids must be unique, so an edited or reordered input never
shifts them). Output: a JSONL with one row per item, {"id", "video",
"caption", "finish_reason" ("length": cut at max_tokens), "prompt_tokens", "output_tokens"} or
{"id", "video", "error"}. Each row is appended durably (durable.py) as its chunk finishes: after a
kill -9 at any moment, a rerun cuts a torn last row, redoes that item and skips every id already
in the output. Error rows are kept and skipped too, unless --retry-errors: then those items run
again and their new row is appended (an id's last row is its result). One bad item becomes its
error row; the rest of its chunk still runs. Ctrl-C shuts the engine down and raises
CaptionInterrupted (the rows written stay; a rerun resumes); a rerun with nothing to do starts
no engine. The command's --ray form sends the items to engine replicas on a Ray cluster and writes
what they return by the same rules, through this module's public functions (caption_todo,
open_caption_engine, run_chunk); nothing here knows of Ray.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from .knobs import knob
from .durable import append_jsonl, read_jsonl
from .engine_stats import spec_counters
from .prompts import chat_prompt

VIDEO_SUFFIXES = (".mp4", ".webm", ".mkv", ".mov", ".avi")


@dataclass
class CaptionJob:
    """`sparrow caption`: every option of the job is a field here (knobs.py); the command's cluster
    options (--ray, --replicas, ...) are its own, beside this config."""

    inputs: str = knob(help="folder of videos, or a JSONL or Parquet listing of {video, prompt?, id?}")
    out: str = knob(help="output JSONL (appended; rerun the same command to resume)")
    target: str = knob(help="target model directory or name")
    draft: str | None = knob(None, "Sparrow draft directory (omit: no speculation)")
    num_speculative_tokens: int | None = knob(None, "speculative tokens per step (default: the draft's recommended "
                                                    "depth, its config.json, as vLLM serves it)", flag="--k")
    prompt: str = knob("Describe this video in detail.", "prompt of items that bring none")
    num_frames: int = knob(16, "frames sampled per video", flag="--frames")
    max_tokens: int = knob(256, "longest caption")
    chunk: int = knob(8, "requests handed to vLLM at once (--ray: the batch a replica takes)")
    limit: int | None = knob(None, "stop after this many new items (trial runs)")
    retry_errors: bool = knob(False, "run the items whose row is an error again (their new row is appended; an "
                                     "id's last row is its result)")
    log: str = knob("", "where vLLM's own output goes (default: OUT.vllm.log; '-': the terminal)")
    engine_args: dict[str, Any] = knob(default_factory=dict, help='extra LLM(...) arguments as JSON, e.g. '
                                       '{"max_model_len": 32768}')


@dataclass
class CaptionReport:
    done: int
    errors: int
    skipped: int  # already in the output
    seconds: float
    output_tokens: int
    mean_acceptance_length: float | None
    served: dict[str, int] = field(default_factory=dict)  # --ray: rows written per replica (host:pid)

    @classmethod
    def nothing_done(cls, skipped: int) -> CaptionReport:
        """A run whose items are all in the output already: it starts no engine."""
        return cls(0, 0, skipped, 0.0, 0, None)

    def summary(self) -> str:
        if not (self.done or self.errors):
            return f"nothing to do: all {self.skipped} items are in the output already (no engine started)"
        rate = self.done / self.seconds if self.seconds else 0.0
        acc = "n/a" if self.mean_acceptance_length is None else f"{self.mean_acceptance_length:.2f}"
        retry = "; error rows are kept: rerun with --retry-errors to try them again" if self.errors else ""
        served = ""
        if self.served:
            each = ", ".join(f"{name} {n}" for name, n in sorted(self.served.items()))
            served = f"; served by {len(self.served)} replica{'s' if len(self.served) > 1 else ''} ({each})"
        return (f"{self.done} captioned, {self.errors} errors, {self.skipped} already done; "
                f"{rate:.2f} videos/s, {self.output_tokens / max(self.seconds, 1e-9):.1f} tokens/s; "
                f"mean acceptance length {acc}{served}{retry}")


class DuplicateIds(ValueError):
    pass


class CaptionInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run: the engine was shut down; `rows` rows were written this run."""

    def __init__(self, rows: int) -> None:
        super().__init__(rows)
        self.rows = rows


def list_items(inputs: str | Path, prompt: str) -> list[dict]:
    """The job's items in input order; raises DuplicateIds (naming the lines) when two share an id."""
    src = Path(inputs)
    if src.is_dir():
        return [{"id": p.name, "video": str(p), "prompt": prompt}
                for p in sorted(src.iterdir()) if p.suffix.lower() in VIDEO_SUFFIXES]
    items, lines = [], defaultdict(list)
    where = "row" if src.suffix.lower() == ".parquet" else "line"
    for n, row in _listed(src):
        try:
            if not isinstance(row, dict) or not isinstance(row.get("video"), str):
                raise TypeError(row if isinstance(row, Exception) else "not a JSON object with a 'video' path")
            video = str((src.parent / row["video"]) if not Path(row["video"]).is_absolute() else row["video"])
            ident = row["video"] if row.get("id") is None else row["id"]  # a Parquet row without one: None
            item = {"id": str(ident), "video": video, "prompt": row.get("prompt") or prompt}
        except TypeError as e:
            item = {"id": f"{where} {n}", "video": None, "prompt": prompt,
                    "error": f"{where} {n}: not a JSON object with a 'video' path ({e})"}
        lines[item["id"]].append(n)
        items.append(item)
    dup = {i: ns for i, ns in lines.items() if len(ns) > 1}
    if dup:
        shown = "; ".join(f"id {i!r} on {where}s {', '.join(map(str, ns))}" for i, ns in list(dup.items())[:5])
        raise DuplicateIds(f"{src}: ids must be unique (resume skips by id): {shown}"
                           f"{' ...' if len(dup) > 5 else ''}. Give each row its own \"id\".")
    return items


def _listed(src: Path) -> Iterator[tuple[int, Any]]:
    """(number from 1, the row as a dict, or why it is none) of a JSONL's non-blank lines or a
    Parquet file's rows."""
    if src.suffix.lower() == ".parquet":
        import pyarrow.parquet as pq

        yield from enumerate(pq.read_table(src).to_pylist(), 1)
        return
    for n, line in enumerate(src.read_text().splitlines(), 1):
        if line.strip():
            try:
                yield n, json.loads(line)
            except json.JSONDecodeError as e:
                yield n, e


@dataclass
class CaptionTodo:
    """What a run of a job has to do: its items not in the output yet, and how many are."""

    items: list[dict]  # in input order, --limit applied; an item listed badly carries its "error"
    skipped: int  # items already in the output


def caption_todo(job: CaptionJob) -> CaptionTodo:
    """The job's items not in its output yet (with --retry-errors: nor those whose row is an
    error). Bad input (DuplicateIds) fails here, before any engine starts."""
    items = list_items(job.inputs, job.prompt)
    done = done_ids(Path(job.out), job.retry_errors)
    todo = [it for it in items if it["id"] not in done]
    return CaptionTodo(todo if job.limit is None else todo[: job.limit], len(items) - len(todo))


def caption_batch(job: CaptionJob, llm=None, progress: bool = True, progress_file=None) -> CaptionReport:
    """Caption job's items not in its output yet. llm: an engine to use (default: one opened
    here, and shut down here, also on Ctrl-C); progress_file: where the progress bar goes."""
    todo = caption_todo(job)
    if not todo.items:  # nothing to do: no engine
        return CaptionReport.nothing_done(todo.skipped)
    rows: list[str] = []
    try:
        with engine_session(lambda: open_caption_engine(job), llm) as engine:
            return _caption(engine, job, todo.items, todo.skipped, rows, progress, progress_file)
    except EngineInterrupted:
        raise CaptionInterrupted(len(rows)) from None


class EngineInterrupted(KeyboardInterrupt):
    """Ctrl-C during an engine_session: the engine it opened was shut down."""


@contextlib.contextmanager
def engine_session(open_engine: Callable[[], Any], llm=None) -> Iterator[Any]:
    """An engine for a batch job: `llm`, or one from open_engine() that is shut down on the way
    out, also on Ctrl-C (the engine processes go before the command reports). Ctrl-C, also while
    the engine starts, leaves as EngineInterrupted; so does the EngineDeadError it causes when it
    reaches vLLM's engine process first (the terminal signals the whole process group)."""
    from vllm.v1.engine.exceptions import EngineDeadError

    own, interrupted = llm is None, [False]
    try:
        llm = llm or open_engine()
        with _sigint_noted(interrupted):  # after the start: interruptible_start needs the default handler
            yield llm
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt) or (isinstance(e, EngineDeadError) and interrupted[0]):
            raise EngineInterrupted() from None
        raise
    finally:
        if own and llm is not None:
            llm.llm_engine.engine_core.shutdown()


@contextlib.contextmanager
def _sigint_noted(flag: list[bool]) -> Iterator[None]:
    """SIGINT sets flag[0] and raises KeyboardInterrupt as without the handler (main thread only)."""
    import signal
    import threading

    def on_sigint(signum, frame):
        flag[0] = True
        signal.default_int_handler(signum, frame)

    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, on_sigint) if main else None
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def _caption(llm, job, todo, skipped, written, progress, progress_file) -> CaptionReport:
    from tqdm import tqdm

    before = spec_counters(llm)
    params = caption_params(job)
    prompts = templater(job.target)
    start, n_done, n_err, n_tok = time.perf_counter(), 0, 0, 0
    bar = tqdm(total=len(todo), desc="caption", unit="video", disable=not progress, file=progress_file)
    try:
        for lo in range(0, len(todo), job.chunk):
            rows = run_chunk(llm, todo[lo : lo + job.chunk], job, params, prompts)
            for row in rows:
                append_jsonl(Path(job.out), row)
                written.append(row["id"])
            n_err += sum("error" in r for r in rows)
            n_done += sum("caption" in r for r in rows)
            n_tok += sum(r.get("output_tokens", 0) for r in rows)
            bar.update(len(rows))
    finally:
        bar.close()
    after = spec_counters(llm)
    drafts = after["num_drafts"] - before["num_drafts"]
    acc = 1 + (after["num_accepted_tokens"] - before["num_accepted_tokens"]) / drafts if drafts else None
    return CaptionReport(n_done, n_err, skipped, time.perf_counter() - start, n_tok, acc)


def caption_params(job: CaptionJob):
    """Greedy, up to --max-tokens: every caption of a job, one process or replicas."""
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=job.max_tokens)


def run_chunk(llm, items, job, params, templater) -> list[dict]:
    """The output rows of `items`, in their order: one batch through the engine, each item that
    cannot be decoded or that vLLM refuses as its error row. templater: templater(job.target)."""
    from .video import decode_video

    rows, requests = [], []
    for it in items:
        if "error" in it:
            rows.append({"id": it["id"], "video": it["video"], "error": it["error"]})
            continue
        try:
            video = decode_video(it["video"], num_frames=job.num_frames)
        except ValueError as e:  # missing, corrupt, not a video
            rows.append({"id": it["id"], "video": it["video"], "error": str(e)})
            continue
        requests.append((it, {"prompt": templater(it["prompt"]), "multi_modal_data": {"video": video}}))
    outputs = generate_each(llm, [r for _, r in requests], params)
    for (it, _), o in zip(requests, outputs):
        if isinstance(o, Exception):
            rows.append({"id": it["id"], "video": it["video"], "error": str(o)})
        else:
            rows.append({"id": it["id"], "video": it["video"], "caption": o.outputs[0].text,
                         "finish_reason": o.outputs[0].finish_reason, "prompt_tokens": len(o.prompt_token_ids),
                         "output_tokens": len(o.outputs[0].token_ids)})
    return rows


def generate_each(llm, requests: list[dict], params) -> list:
    """llm.generate(requests) in one batch: a RequestOutput per request, or the exception of a
    request vLLM refused (e.g. longer than max_model_len) while the others still run."""
    from vllm.exceptions import VLLMClientError

    try:
        return llm.generate(requests, params, use_tqdm=False)
    except (ValueError, VLLMClientError):  # vLLM refused one request; it aborted the ones it
        # had added, so each runs alone and only the bad one fails
        return [_one(llm, request, params) for request in requests]


class RequestRefused(ValueError):
    """vLLM's reason for refusing one request, with what to change where its own advice misleads."""


# vLLM 0.32 says to raise --limit-mm-per-prompt; the cache is sized from max_num_batched_tokens
ENCODER_CACHE_HINT = ("; sparrow: vLLM sizes its encoder cache from max_num_batched_tokens, so give "
                      "--engine-args '{\"max_num_batched_tokens\": N}' with N at least the video's "
                      "embedding tokens, or fewer frames")


def refusal(error: Exception) -> RequestRefused:
    text = str(error)
    if "pre-allocated encoder cache size" in text:
        text += ENCODER_CACHE_HINT
    return RequestRefused(text)


def _one(llm, request, params):
    from vllm.exceptions import VLLMClientError

    try:
        return llm.generate([request], params, use_tqdm=False)[0]
    except (ValueError, VLLMClientError) as e:
        return refusal(e)


def done_ids(out: Path, retry_errors: bool = False) -> set[str]:
    """Ids already in the output (with retry_errors: those whose last row is not an error); a
    row torn by a kill is cut off (its item runs again)."""
    last = {str(row["id"]): row for row in read_jsonl(out) if "id" in row}
    return {i for i, row in last.items() if not (retry_errors and "error" in row)}


def templater(target: str):
    """text -> the target's chat prompt with one video before the text."""
    from transformers import AutoProcessor

    proc = AutoProcessor.from_pretrained(target)

    return lambda text: chat_prompt(proc, text, "video")


def open_caption_engine(job: CaptionJob):
    """The job's engine: the target, with the Sparrow draft when given, its stats kept (acceptance)."""
    kw: dict[str, Any] = dict(limit_mm_per_prompt={"video": 1}, disable_log_stats=False)
    if job.draft:
        kw["speculative_config"] = {"method": "sparrow", "model": job.draft}
        if job.num_speculative_tokens is not None:
            kw["speculative_config"]["num_speculative_tokens"] = job.num_speculative_tokens
    return open_engine(job.target, {**kw, **job.engine_args})


def open_engine(target: str, engine_args: dict[str, Any]):
    """vLLM's LLM(model=target, **engine_args), started so that Ctrl-C while it starts raises
    KeyboardInterrupt instead of being lost in vLLM's start-up wait (lifetime.interruptible_start)."""
    from vllm import LLM

    from .lifetime import interruptible_start

    with interruptible_start():
        return LLM(model=target, **engine_args)
