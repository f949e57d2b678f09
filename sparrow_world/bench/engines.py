"""One in-process vLLM engine per method, and what the benchmark reads out of it.

Draft time is timed around the runner's `drafter.propose` (every method's proposer is called
there), with the device synchronised on both sides on CUDA (else it would time the kernel
launches only); per call it can also keep what the step scheduled (`keep_calls`), so a script
can read the draft time of one chosen step. Draft cache bytes are measured, not derived:
Sparrow's are the bytes of its drafter's ring tensors per request slot; EAGLE's are the KV blocks
vLLM's scheduler holds for a request at its peak (read from the block pool at every schedule)
times the bytes per block of the draft model's attention layers (read from the KV tensors vLLM
bound to them).
"""

from __future__ import annotations

import gc
import os
import time
from pathlib import Path
from typing import Any

import torch

from .config import BenchConfig, enforce_eager


def speculative_config(method: str, cfg: BenchConfig) -> dict | None:
    k = cfg.num_speculative_tokens
    if method == "none":
        return None
    if k is None and not (method in cfg.ablations and "@" in cfg.ablations[method].split(",")[0]):
        raise SystemExit(f"{method}: no --k given and no Sparrow draft at {cfg.sparrow!r} to take its recommended "
                         "depth from; pass --k or --sparrow")
    if method == "sparrow":
        return {"method": "sparrow", "model": cfg.sparrow, "num_speculative_tokens": k}
    if method == "eagle":
        return {"method": "eagle", "model": cfg.eagle, "num_speculative_tokens": k}
    if method == "eagle3":
        return {"method": "eagle3", "model": cfg.eagle3, "num_speculative_tokens": k}
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    if method in cfg.ablations:
        kind, draft, k = ablation_draft(method, cfg.ablations[method], k, cfg.out)
        if kind in BASELINES:  # a baseline at its own depth: its own draft, its own method
            return {"method": kind, "model": getattr(cfg, kind), "num_speculative_tokens": k}
        spec = {"method": "sparrow", "model": draft}
        return spec if k is None else {**spec, "num_speculative_tokens": k}  # None: the draft's own depth(s)
    raise ValueError(f"unknown method {method!r}; expected none, sparrow, eagle, eagle3, ngram or an ablation name")


BASELINES = ("eagle", "eagle3")  # ablation values naming a baseline ("eagle@12"): that method at its own depth


def ablation_kind(value: str) -> str:
    """"sparrow" for an ablation of a Sparrow draft, else the baseline method it names."""
    return _parse_ablation(value)[0]


def _parse_ablation(value: str) -> tuple[str, str, str, list[str]]:
    """(kind, draft, depth as written: "", digits or "auto", FIELD=VALUE pairs) of an ablation."""
    head, *pairs = value.split(",")
    draft, _, depth = head.rpartition("@")
    if not (draft and (depth == "auto" or depth.isdigit())):
        draft, depth = head, ""
    return (draft if draft in BASELINES else "sparrow"), draft, depth, pairs


def ablation_draft(name: str, value: str, k: int, out: str) -> tuple[str, str, int | None]:
    """An ablation's (kind, draft directory, depth) from "DIR[@K|@auto][,FIELD=VALUE...]": DIR at
    the run's K, at its own K to compare depths in one run, or with @auto at the depth the draft
    itself recommends (its config.json: `speculative_tokens`, or the per-batch-size schedule
    `sparrow tune` wrote); FIELD=VALUE pairs set fields of the draft's config.json
    (",tree_topk=3", ",stop_confidence=0.7"), served from a copy of the draft written to
    <out>/drafts/NAME (the weights linked, not copied). "eagle@K" / "eagle3@K": that baseline at K."""
    kind, draft, depth, pairs = _parse_ablation(value)
    k = None if depth == "auto" else int(depth) if depth else k
    if not pairs or kind != "sparrow":
        return kind, draft, k
    return kind, str(_draft_variant(Path(draft), Path(out) / "drafts" / name, pairs)), k


def _draft_variant(draft: Path, dest: Path, pairs: list[str]) -> Path:
    import dataclasses
    import json

    from vllm_sparrow.config import SparrowConfig

    fields = {f.name for f in dataclasses.fields(SparrowConfig)}
    changes = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or key not in fields:
            raise ValueError(f"ablation override {pair!r}: use FIELD=VALUE with a field of the draft's "
                             f"config ({', '.join(sorted(fields))})")
        try:
            changes[key] = json.loads(raw)
        except json.JSONDecodeError:
            changes[key] = raw
    dest.mkdir(parents=True, exist_ok=True)
    for f in draft.iterdir():  # weights (and a reduced vocabulary) shared with the original
        link = dest / f.name
        if f.name != "config.json" and not link.exists():
            link.symlink_to(f.resolve())
    SparrowConfig.load(draft).replace(**changes).save(dest)
    return dest


def token_budget(cfg: BenchConfig, max_visual_tokens: int, max_num_seqs: int) -> dict[str, int]:
    """The bench's max_model_len and max_num_batched_tokens for videos of max_visual_tokens:
    every prompt of a batch prefilled in one step, so a batch's decode window (first token to
    last) holds decode steps only, not other requests' prefills."""
    max_len = max_visual_tokens + 256 + cfg.max_tokens + 64  # prompt text + caption + margin
    return {"max_model_len": max_len, "max_num_batched_tokens": max(8192, max_len * max_num_seqs)}


def open_engine(method: str, cfg: BenchConfig, max_visual_tokens: int, max_num_seqs: int = 4,
                keep_calls: bool = False, **engine_args):
    """An in-process engine for `method` at cfg's dtype, K and graph setting, its draft timed;
    engine_args override the LLM(...) arguments below (a script's own lengths and budgets)."""
    from vllm import LLM

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process: timers reach the runner
    # CPU build: a KV cache of fixed size. Without one, vLLM asks for 0.92 of the NUMA node's memory
    # to be free at start-up, which fails once an earlier engine of this process has run (seen here).
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    args = dict(model=cfg.target, dtype=cfg.dtype, enforce_eager=enforce_eager(cfg),
                **token_budget(cfg, max_visual_tokens, max_num_seqs), max_num_seqs=max_num_seqs,
                disable_log_stats=False,
                limit_mm_per_prompt={"video": 1}, speculative_config=speculative_config(method, cfg))
    llm = LLM(**{**args, **engine_args})
    if method != "none":
        llm.collective_rpc(_install_draft_timer, kwargs={"keep_calls": keep_calls})
    llm.collective_rpc(_install_forward_timer)
    return llm


def close_engine(llm) -> None:
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


def _drafter(runner):
    """The runner's drafter: the V1 runner's proposer (`drafter`, vLLM 0.32/0.33) or the V2
    runner's speculator (`speculator`, 0.34); None without speculation."""
    return getattr(runner, "drafter", None) or getattr(runner, "speculator", None)


def _install_draft_timer(worker, keep_calls: bool = False) -> None:
    """Time every drafter.propose. On CUDA the device is synchronised before (so the call does
    not pay for the target's queued kernels) and after (so it is not just its launches).
    keep_calls: also keep one entry per call, with the tokens the step scheduled per request
    (read off the scheduler output the runner drafts for: under async scheduling an engine step
    may draft for the batch it scheduled one step earlier)."""
    runner = worker.model_runner
    drafter = _drafter(runner)
    if getattr(drafter, "_bench_timer", None) is not None:
        return
    timer: dict[str, Any] = {"seconds": 0.0, "calls": 0, "log": [] if keep_calls else None}
    inner = drafter.propose
    sync = torch.cuda.synchronize if runner.device.type == "cuda" else (lambda: None)
    scheduled: dict[str, int] = {}  # request id -> tokens the step being drafted for scheduled

    def timed(*args, **kwargs):
        sync()
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            sync()
            end = time.perf_counter()
            timer["seconds"] += end - start
            timer["calls"] += 1
            if timer["log"] is not None:
                timer["log"].append({"start": start, "end": end, "seconds": end - start,
                                     "scheduled": dict(scheduled)})

    drafter.propose = timed
    drafter._bench_timer = timer
    if keep_calls:
        # the step's scheduler output: V1 hands it to propose_draft_token_ids, V2 only to
        # execute_model (its speculator drafts in sample_tokens, right after)
        name = "propose_draft_token_ids" if hasattr(runner, "propose_draft_token_ids") else "execute_model"
        step_inner = getattr(runner, name)

        def tagged(scheduler_output, *args, **kwargs):
            scheduled.clear()
            scheduled.update(scheduler_output.num_scheduled_tokens)
            return step_inner(scheduler_output, *args, **kwargs)

        setattr(runner, name, tagged)  # the instance attribute shadows the method


def _install_forward_timer(worker) -> None:
    """Keep (start, end) of every forward of the target (the runner's _model_forward), on the
    engine's monotonic clock, synchronised on CUDA: what a decode step spends in the target itself,
    the rest being drafting, sampling, verification and the runner's bookkeeping."""
    runner = worker.model_runner
    if getattr(runner, "_bench_forwards", None) is not None:
        return
    calls: list[tuple[float, float]] = []
    # V1 runs the target through its _model_forward; V2 calls the model itself
    owner, name = (runner, "_model_forward") if hasattr(runner, "_model_forward") else (runner.model, "forward")
    inner = getattr(owner, name)
    sync = torch.cuda.synchronize if runner.device.type == "cuda" else (lambda: None)

    def timed(*args, **kwargs):
        sync()
        start = time.monotonic()
        try:
            return inner(*args, **kwargs)
        finally:
            sync()
            calls.append((start, time.monotonic()))

    setattr(owner, name, timed)  # the instance attribute shadows the method
    runner._bench_forwards = calls


def _take_forwards(worker) -> list[tuple[float, float]]:
    calls = getattr(worker.model_runner, "_bench_forwards", None)
    if calls is None:
        return []
    taken = list(calls)
    calls.clear()
    return taken


def forward_seconds(llm, first: float, last: float) -> float:
    """Seconds the target's forwards took inside [first, last] (engine timestamps); the log is
    cleared (every measurement takes the forwards since the previous one)."""
    calls = llm.collective_rpc(_take_forwards)[0]
    return sum(max(0.0, min(end, last) - max(start, first)) for start, end in calls)


def _read_draft_timer(worker) -> dict:
    timer = getattr(_drafter(worker.model_runner), "_bench_timer", None)
    return {"seconds": timer["seconds"], "calls": timer["calls"]} if timer else {"seconds": 0.0, "calls": 0}


def draft_timer(llm) -> dict:
    return llm.collective_rpc(_read_draft_timer)[0]


def _take_draft_calls(worker) -> list[dict]:
    timer = getattr(_drafter(worker.model_runner), "_bench_timer", None)
    if not timer or timer["log"] is None:
        return []
    calls = list(timer["log"])
    timer["log"].clear()
    return calls


def take_draft_calls(llm) -> list[dict]:
    """The draft calls since the last take (engine opened with keep_calls=True), oldest first:
    {start, end, seconds (perf_counter, this process), scheduled: {request id: tokens}}."""
    return llm.collective_rpc(_take_draft_calls)[0]


def _engine_dtypes(worker) -> dict:
    runner = worker.model_runner
    drafter = _drafter(runner)
    served = getattr(drafter, "served", None)  # Sparrow's glues: the served draft, kept off `.model`
    model = getattr(served, "model", None)
    model = getattr(drafter, "model", None) if model is None else model
    model = model.unwrap() if hasattr(model, "unwrap") else model  # out of a CUDA-graph wrapper
    params = next(model.parameters(), None) if isinstance(model, torch.nn.Module) else None
    return {"target": str(next(runner.get_model().parameters()).dtype).removeprefix("torch."),
            "draft": None if params is None else str(params.dtype).removeprefix("torch.")}


def engine_settings(llm) -> dict:
    """What the engine runs with, read back from it: the dtypes its target and draft weights are
    in (what --dtype reached; None: a drafter without weights, as ngram) and whether it is eager."""
    return {"dtypes": llm.collective_rpc(_engine_dtypes)[0],
            "enforce_eager": llm.llm_engine.vllm_config.model_config.enforce_eager}


def _draft_kv_bytes_per_block(worker) -> int:
    """Bytes one KV block takes in the draft model's attention layers (0 for a drafter that keeps
    no vLLM KV cache, as Sparrow and ngram)."""
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase

    runner = worker.model_runner
    model = getattr(_drafter(runner), "model", None)
    if not isinstance(model, torch.nn.Module):
        return 0
    layers = [m for m in model.modules() if isinstance(m, AttentionLayerBase)]
    caches = [m.kv_cache[0] if isinstance(m.kv_cache, (list, tuple)) else m.kv_cache for m in layers]
    return sum(c.numel() * c.element_size() for c in caches) // runner.kv_cache_config.num_blocks


def draft_kv_bytes_per_block(llm) -> int:
    return llm.collective_rpc(_draft_kv_bytes_per_block)[0]


class BlockMeter:
    """The most KV blocks vLLM's scheduler held at once since `reset()` (read from its block pool
    after every schedule; in-process engines only)."""

    def __init__(self, llm) -> None:
        scheduler = llm.llm_engine.engine_core.engine_core.scheduler
        self.pool = scheduler.kv_cache_manager.block_pool
        self.peak = 0
        inner = scheduler.schedule

        def schedule(*args, **kwargs):
            out = inner(*args, **kwargs)
            self.peak = max(self.peak, self.pool.num_gpu_blocks - 1 - self.pool.get_num_free_blocks())
            return out

        scheduler.schedule = schedule

    def reset(self) -> None:
        self.peak = 0


def generate_one(llm, request: dict, max_tokens: int) -> dict[str, Any]:
    """Greedy caption of one request alone (batch size 1, as speculative-decoding speedups are
    quoted); times from the engine's own per-request stats."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    t0 = time.perf_counter()
    out = llm.generate([request], params, use_tqdm=False)[0]
    wall = time.perf_counter() - t0
    m = out.metrics
    ids = list(out.outputs[0].token_ids)
    decode_s = max(0.0, m.last_token_ts - m.first_token_ts) if m is not None else float("nan")
    return {"request_id": out.request_id, "token_ids": ids, "text": out.outputs[0].text,
            "prompt_tokens": len(out.prompt_token_ids), "wall_s": wall, "decode_s": decode_s,
            "forward_s": forward_seconds(llm, m.first_token_ts, m.last_token_ts) if m is not None else float("nan"),
            "ttft_s": m.first_token_latency if m is not None else float("nan")}
