"""One in-process vLLM engine per method, and what the benchmark reads out of it.

Draft time is timed around the runner's `drafter.propose` (every method's proposer is called
there); draft cache bytes come from the Sparrow drafter's own accounting, and for the EAGLE
baseline from its config (vLLM keeps a draft K/V entry for every token, visual ones included).
"""

from __future__ import annotations

import gc
import json
import math
import os
import time
from pathlib import Path
from typing import Any

from .config import BenchConfig


def speculative_config(method: str, cfg: BenchConfig) -> dict | None:
    k = cfg.num_speculative_tokens
    if method == "none":
        return None
    if method == "sparrow":
        return {"method": "sparrow", "model": cfg.sparrow, "num_speculative_tokens": k}
    if method == "eagle":
        return {"method": "eagle", "model": cfg.eagle, "num_speculative_tokens": k}
    if method == "eagle3":
        return {"method": "eagle3", "model": cfg.eagle3, "num_speculative_tokens": k}
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    if method in cfg.ablations:
        draft, k = ablation_draft(cfg.ablations[method], k)
        return {"method": "sparrow", "model": draft, "num_speculative_tokens": k}
    raise ValueError(f"unknown method {method!r}; expected none, sparrow, eagle, eagle3, ngram or an ablation name")


def ablation_draft(value: str, k: int) -> tuple[str, int]:
    """An ablation's draft directory and depth: "DIR" (the run's K) or "DIR@K" (its own K, to
    compare depths in one run)."""
    draft, _, depth = value.rpartition("@")
    return (draft, int(depth)) if draft and depth.isdigit() else (value, k)


def open_engine(method: str, cfg: BenchConfig, max_visual_tokens: int, max_num_seqs: int = 4):
    from vllm import LLM

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process: timers reach the runner
    max_len = max_visual_tokens + 256 + cfg.max_tokens + 64  # prompt text + caption + margin
    # Every prompt of a batch prefilled in one step, so a batch's decode window (first token to
    # last) holds decode steps only, not other requests' prefills.
    llm = LLM(model=cfg.target, dtype=cfg.dtype, enforce_eager=True, max_model_len=max_len,
              max_num_batched_tokens=max(8192, max_len * max_num_seqs), max_num_seqs=max_num_seqs,
              disable_log_stats=False,
              limit_mm_per_prompt={"video": 1}, speculative_config=speculative_config(method, cfg))
    if method != "none":
        llm.collective_rpc(_install_draft_timer)
    return llm


def close_engine(llm) -> None:
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


def _install_draft_timer(worker) -> None:
    runner = worker.model_runner
    drafter = runner.drafter
    if getattr(drafter, "_bench_timer", None) is not None:
        return
    timer = {"seconds": 0.0, "calls": 0}
    inner = drafter.propose

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            timer["seconds"] += time.perf_counter() - t0
            timer["calls"] += 1

    drafter.propose = timed
    drafter._bench_timer = timer


def _read_draft_timer(worker) -> dict:
    timer = getattr(worker.model_runner.drafter, "_bench_timer", None)
    return dict(timer) if timer else {"seconds": 0.0, "calls": 0}


def draft_timer(llm) -> dict:
    return llm.collective_rpc(_read_draft_timer)[0]


def eagle_cache_bytes(eagle_dir: str, tokens: int, block_size: int = 16) -> int:
    """Bytes of draft K/V vLLM holds for one request of `tokens` tokens (whole blocks)."""
    cfg = json.loads((Path(eagle_dir) / "config.json").read_text())
    heads = cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    elem = {"float32": 4, "float16": 2, "bfloat16": 2}.get(str(cfg.get("torch_dtype", cfg.get("dtype", "float32"))), 4)
    layers = cfg.get("num_hidden_layers", 1)
    return math.ceil(tokens / block_size) * block_size * layers * 2 * heads * head_dim * elem


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
            "ttft_s": m.first_token_latency if m is not None else float("nan")}
