"""Run the benchmark: every method over every visual length and batch size, one record per
(method, length, batch), each the summary of `rounds` measurements.

Batch size 1 captions the clips one after another (speedups as speculative decoding quotes
them); batch size B > 1 submits B clips of the same length together and measures aggregate
decode throughput. A round measures every method once, in its own engine, in an order that
changes from round to round (round_order), and speedups are taken within a round (against that
round's no-speculation engine), so neither drift over the run nor the engine a method follows
decides its number: the reported value is the median over rounds, with the range beside it.
Measurements are appended to <out>/records.jsonl as each finishes, so a rerun with the same
settings skips what is done; results.json, table.md and plot.png are rewritten at the end from
all of them.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import statistics
import time
from pathlib import Path

from vllm_sparrow.durable import append_jsonl, atomic_write_text, read_jsonl
from .clips import Clip, eval_clips
from .config import BenchConfig
from .engines import (BlockMeter, ablation_kind, close_engine, draft_kv_bytes_per_block, draft_timer,
                      engine_settings, forward_seconds, generate_one, open_engine)

# Per-round values summarised as median and range (speedups are per round, against that round's "none").
TIMED = ("decode_tok_s", "decode_speedup", "e2e_speedup", "draft_ms_per_step", "e2e_s", "decode_s", "ttft_s",
         "target_forward_s", "outside_forward_share", "limit_speedup")
# Spec-decode counters pooled over rounds (greedy: every round drafts the same captions).
COUNTED = ("drafts", "accepted", "draft_tokens")


def run_bench(cfg: BenchConfig) -> list[dict]:
    from transformers import AutoTokenizer

    from ..tiny_targets import make_prompt
    from .report import write_reports

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    clips = eval_clips(out / "clips", cfg.lengths, max(cfg.clips_per_length, *cfg.batch_sizes), cfg.seed0, cfg.world)
    tok = AutoTokenizer.from_pretrained(cfg.target)
    prompt = make_prompt("qwen2_5_vl", tok, cfg.prompt, media="video")
    done = _load_records(out / "records.jsonl", cfg)
    methods = list(dict.fromkeys(["none", *cfg.methods, *cfg.ablations]))
    cells = [(n, b) for n in cfg.lengths for b in cfg.batch_sizes]
    total = len(methods) * len(cells) * cfg.rounds
    for r, order in enumerate(round_orders(methods, cfg.rounds)):
        for method in order:
            todo = [(n, b) for n, b in cells if (method, n, b, r) not in done]
            if todo:
                _measure_method(cfg, method, r, todo, clips, prompt, tok, done, out, total)
    records = summarize(done, methods, cells, cfg.rounds)
    write_reports(out, records, cfg, environment())
    return records


def round_orders(methods: list[str], rounds: int) -> list[list[str]]:
    """The method order of each round, chosen so that a method follows another method in each
    round (and sits at another place) as far as the rounds allow: each round takes the row of a
    Williams square (a Latin square in which every ordered pair of neighbours occurs once over its
    rows; for an odd count its rows and their mirrors) that repeats the fewest neighbour pairs,
    then places, of the rounds before. Four methods [none, sparrow, eagle, eagle3], three rounds:
    [none, sparrow, eagle3, eagle], [sparrow, eagle, none, eagle3], [eagle, eagle3, sparrow, none]:
    sparrow follows none, then nothing (first), then eagle3."""
    m = len(methods)
    base, lo, hi = [0], 1, m - 1  # 0, 1, m-1, 2, m-2, ...: every neighbour difference once (even m)
    while len(base) < m:
        base.append(lo)
        lo += 1
        if len(base) < m:
            base.append(hi)
            hi -= 1
    rows = [[(x + i) % m for x in base] for i in range(m)]
    rows += [] if m % 2 == 0 else [row[::-1] for row in rows]
    chosen: list[list[int]] = []
    pairs: set[tuple[int, int]] = set()
    places: set[tuple[int, int]] = set()
    for _ in range(rounds):
        row = min(rows, key=lambda o: (sum(p in pairs for p in zip(o, o[1:])),
                                      sum(p in places for p in enumerate(o))))
        chosen.append(row)
        pairs.update(zip(row, row[1:]))
        places.update(enumerate(row))
    return [[methods[i] for i in row] for row in chosen]


def _measure_method(cfg: BenchConfig, method: str, r: int, todo: list[tuple[int, int]], clips, prompt: str, tok,
                    done: dict, out: Path, total: int) -> None:
    """One engine for `method`: warmed up at every batch size it will measure, then each cell."""
    t0 = time.perf_counter()
    llm = open_engine(method, cfg, max(cfg.lengths), max_num_seqs=max(4, *cfg.batch_sizes))
    meter = BlockMeter(llm)
    print(f"[bench] round {r + 1}/{cfg.rounds}, {method}: engine up in {time.perf_counter() - t0:.0f}s", flush=True)
    try:
        warm_up(llm, prompt, clips[min(cfg.lengths)], sorted({b for _, b in todo}))
        for n, b in todo:
            if b == 1:
                rec = measure(llm, meter, method, n, clips[n][: cfg.clips_per_length], prompt, tok, cfg)
            else:
                rec = measure_batch(llm, meter, method, n, clips[n][:b], prompt, tok, cfg)
            rec["round"] = r
            done[(method, n, b, r)] = rec
            append_jsonl(out / "records.jsonl", rec)  # durable: a kill loses at most this cell
            print(f"[bench {len(done)}/{total}] {_line(rec)}", flush=True)
    finally:
        close_engine(llm)
        # Drop this engine before the next one opens: on one GPU whatever it still holds
        # (vLLM's EAGLE drafter shares the target's embedding and head) would not fit twice.
        llm = meter = None
        gc.collect()


def warm_up(llm, prompt: str, clips: list[Clip], batch_sizes: list[int]) -> None:
    """Not measured: a short caption at every batch size the engine will measure, so that its
    first measured cell does not pay for first calls (kernel and allocator caches per shape)."""
    from vllm import SamplingParams

    for b in batch_sizes:
        llm.generate([_request(prompt, c) for c in clips[:b]], SamplingParams(temperature=0.0, max_tokens=32),
                     use_tqdm=False)


def summarize(done: dict, methods: list[str], cells: list[tuple[int, int]], rounds: int) -> list[dict]:
    """One record per (method, length, batch): speedups within each round, then the median (and
    [min, max] as `<key>_range`, the rounds' values as `per_round`) of every timed value, the
    spec-decode counters pooled, outputs equal to no speculation's in every round."""
    for r in range(rounds):
        compare_to_baseline([done[(m, n, b, r)] for m in methods for n, b in cells])
    records = []
    for m in methods:
        for n, b in cells:
            runs = [done[(m, n, b, r)] for r in range(rounds)]
            rec = {k: v for k, v in runs[0].items() if k != "round"}
            rec["rounds"] = rounds
            rec["per_round"] = {}
            for key in TIMED:
                values = [x.get(key) for x in runs]
                if any(v is None for v in values):
                    continue
                rec[key], rec[key + "_range"] = statistics.median(values), [min(values), max(values)]
                rec["per_round"][key] = values
            if "outputs_equal_no_spec" in rec:
                rec["outputs_equal_no_spec"] = all(x["outputs_equal_no_spec"] for x in runs)
            rec["outputs_equal_across_rounds"] = all(x["output_token_ids"] == runs[0]["output_token_ids"] for x in runs)
            if rec.get("drafts"):
                _pool_counters(rec, runs)
            records.append(rec)
    return records


def _pool_counters(rec: dict, runs: list[dict]) -> None:
    for key in COUNTED:
        rec[key] = sum(x[key] for x in runs)
    per_pos = [sum(x["per_position"][i] * x["drafts"] for x in runs) for i in range(len(rec["per_position"]))]
    rec["acceptance_length"] = 1 + rec["accepted"] / rec["drafts"]
    rec["acceptance_length_no_bonus"] = rec["accepted"] / rec["drafts"]
    rec["per_position"] = [p / rec["drafts"] for p in per_pos]


def measure(llm, meter: BlockMeter, method: str, tokens: int, clips: list[Clip], prompt: str, tok,
            cfg: BenchConfig) -> dict:
    """Batch size 1: the clips captioned one after another."""
    before, timer0 = _counters(llm, method)
    outs, per_clip = [], []
    for c in clips:
        meter.reset()
        clip0 = _counters(llm, method)[0]
        outs.append({**generate_one(llm, _request(prompt, c), cfg.max_tokens), "kv_blocks": meter.peak})
        per_clip.append(_clip_acceptance(llm, clip0))
    rec = {"method": method, "visual_tokens": tokens, "batch": 1, "clips": len(clips),
           "per_clip": per_clip,  # each scene's drafts and accepted tokens: flatness judged scene by scene
           "prompt_tokens": [o["prompt_tokens"] for o in outs],
           "output_token_ids": [o["token_ids"] for o in outs],
           "e2e_s": sum(o["wall_s"] for o in outs), "ttft_s": sum(o["ttft_s"] for o in outs) / len(outs),
           "decode_tokens": sum(len(o["token_ids"]) - 1 for o in outs),
           "decode_s": sum(o["decode_s"] for o in outs), "target_forward_s": sum(o["forward_s"] for o in outs)}
    rec["decode_tok_s"] = rec["decode_tokens"] / rec["decode_s"] if rec["decode_s"] > 0 else None
    return _finish(rec, llm, method, before, timer0, outs, clips, tok, cfg)


def measure_batch(llm, meter: BlockMeter, method: str, tokens: int, clips: list[Clip], prompt: str, tok,
                  cfg: BenchConfig) -> dict:
    """Batch size B = len(clips): the clips submitted together and prefilled in one step (the
    engine's token budget allows it); aggregate decode throughput = decode tokens of all requests
    / (last token time - latest first-token time)."""
    from vllm import SamplingParams

    before, timer0 = _counters(llm, method)
    meter.reset()
    t0 = time.perf_counter()
    results = llm.generate([_request(prompt, c) for c in clips], SamplingParams(temperature=0.0, max_tokens=cfg.max_tokens),
                           use_tqdm=False)
    wall = time.perf_counter() - t0
    first = max(r.metrics.first_token_ts for r in results)
    last = max(r.metrics.last_token_ts for r in results)
    outs = [{"token_ids": list(r.outputs[0].token_ids), "prompt_tokens": len(r.prompt_token_ids),
             "kv_blocks": meter.peak / len(results)} for r in results]  # the batch's peak, per request
    rec = {"method": method, "visual_tokens": tokens, "batch": len(clips), "clips": len(clips),
           "prompt_tokens": [o["prompt_tokens"] for o in outs], "output_token_ids": [o["token_ids"] for o in outs],
           "e2e_s": wall, "ttft_s": sum(r.metrics.first_token_latency for r in results) / len(results),
           "decode_tokens": sum(len(o["token_ids"]) - 1 for o in outs), "decode_s": last - first,
           "target_forward_s": forward_seconds(llm, first, last)}
    rec["decode_tok_s"] = rec["decode_tokens"] / rec["decode_s"] if rec["decode_s"] > 0 else None
    return _finish(rec, llm, method, before, timer0, outs, clips, tok, cfg)


def _clip_acceptance(llm, before: dict | None) -> dict | None:
    """One clip's spec-decode counters (the counters' change while it ran alone)."""
    from vllm_sparrow.engine_stats import spec_counters

    if before is None:
        return None
    after = spec_counters(llm)
    return {"drafts": after["num_drafts"] - before["num_drafts"],
            "accepted": after["num_accepted_tokens"] - before["num_accepted_tokens"]}


def _counters(llm, method: str):
    from vllm_sparrow.engine_stats import spec_counters

    return (spec_counters(llm), draft_timer(llm)) if method != "none" else (None, None)


def _finish(rec: dict, llm, method: str, before, timer0, outs: list[dict], clips: list[Clip], tok,
            cfg: BenchConfig) -> dict:
    """Caption accuracy, acceptance and draft time since `before`, and draft cache bytes."""
    from vllm_sparrow.engine_stats import spec_counters

    rec.update(caption_accuracy(tok, [o["token_ids"] for o in outs], [c.truth for c in clips],
                                [c.facts for c in clips] if clips and clips[0].facts is not None else None))
    if method != "none":
        after, timer1 = spec_counters(llm), draft_timer(llm)
        drafts = after["num_drafts"] - before["num_drafts"]
        accepted = after["num_accepted_tokens"] - before["num_accepted_tokens"]
        draft_tokens = after["num_draft_tokens"] - before["num_draft_tokens"]
        per_pos = [a - b for a, b in zip(after["per_pos"], before["per_pos"] or [0] * len(after["per_pos"]))]
        calls = timer1["calls"] - timer0["calls"]
        rec.update(drafts=drafts, accepted=accepted, draft_tokens=draft_tokens,
                   acceptance_length=1 + accepted / drafts if drafts else None,
                   acceptance_length_no_bonus=accepted / drafts if drafts else None,
                   per_position=[p / drafts for p in per_pos] if drafts else None,
                   draft_ms_per_step=1000 * (timer1["seconds"] - timer0["seconds"]) / calls if calls else None)
    # The share of the decode phase spent outside the target's own forwards (drafting, the glue,
    # sampling and verification bookkeeping): at 0 a method would run at its limit.
    rec["outside_forward_share"] = 1 - rec["target_forward_s"] / rec["decode_s"] if rec["decode_s"] > 0 else None
    rec["engine"] = engine_settings(llm)  # the dtypes and graph mode the engine really ran
    rec["kv_blocks"] = [o["kv_blocks"] for o in outs]  # vLLM's KV blocks per request at its peak
    rec["draft_kv_bytes_per_block"] = draft_kv_bytes_per_block(llm)  # in vLLM's draft layers (EAGLE)
    rec["draft_cache_bytes"] = _cache_bytes(llm, method, rec, cfg)
    return rec


def caption_accuracy(tok, outputs: list[list[int]], truths: list[str], facts: list[frozenset] | None = None) -> dict:
    """How close the greedy captions are to the true ones: word accuracy (1 - word edit distance
    / true length, so one missed object costs its words, not everything after it), objects named
    right (precision/recall of "colour shape" pairs) and exact matches. With `facts` (the hard
    world, where a scene has many right captions): fact accuracy instead of words, scored by
    meaning (hard_caption.facts), and objects read from the facts."""
    texts = [" ".join(tok.decode(ids, skip_special_tokens=True).split()) for ids in outputs]
    if facts is not None:
        return _fact_accuracy(texts, facts)
    acc = [max(0.0, 1 - _edit_distance(w.split(), t.split()) / len(t.split())) for w, t in zip(texts, truths)]
    said, true = [_objects(w) for w in texts], [_objects(t) for t in truths]
    hit = sum(len(a & b) for a, b in zip(said, true))
    return {"caption_word_accuracy": sum(acc) / len(acc),
            "object_precision": hit / max(1, sum(map(len, said))), "object_recall": hit / max(1, sum(map(len, true))),
            "caption_exact": sum(w == t for w, t in zip(texts, truths)) / len(truths)}


def _fact_accuracy(texts: list[str], facts: list[frozenset]) -> dict:
    """Fact accuracy per caption: right facts / (facts said + required facts missed); required are
    the scene's facts but the optional clauses' (colour counts, late arrivals, early exits)."""
    from ..world.hard_caption import facts as read

    scores, hit, said_n, true_n = [], 0, 0, 0
    for text, true in zip(texts, facts):
        said = read(text)
        required = {f for f in true if " count " not in f and not f.endswith((" late", " leaves"))}
        scores.append(len(said & true) / max(1, len(said | required)))
        names, true_names = {f for f in said if len(f.split()) == 2}, {f for f in true if len(f.split()) == 2}
        hit, said_n, true_n = hit + len(names & true_names), said_n + len(names), true_n + len(true_names)
    return {"caption_word_accuracy": None, "caption_fact_accuracy": sum(scores) / len(scores),
            "object_precision": hit / max(1, said_n), "object_recall": hit / max(1, true_n), "caption_exact": None}


def _objects(text: str) -> set[str]:
    """The "colour shape" pairs a world caption names ("there is a red circle , ...")."""
    return {" ".join(s.split()[3:5]) for s in text.split(" . ") if s.startswith("there is a ")}


def _edit_distance(a: list[str], b: list[str]) -> int:
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


def compare_to_baseline(records: list[dict]) -> None:
    """Speedups and output equality against the no-speculation record of the same length and
    batch size."""
    base = {(r["visual_tokens"], r["batch"]): r for r in records if r["method"] == "none"}
    for r in records:
        b = base.get((r["visual_tokens"], r["batch"]))
        if b is None:
            continue
        r["outputs_equal_no_spec"] = r["output_token_ids"] == b["output_token_ids"]
        r["decode_speedup"] = (r["decode_tok_s"] / b["decode_tok_s"]) if r["decode_tok_s"] and b["decode_tok_s"] else None
        r["e2e_speedup"] = b["e2e_s"] / r["e2e_s"]
        r["limit_speedup"] = _limit_speedup(r, b)


def _limit_speedup(r: dict, b: dict) -> float | None:
    """The decode speedup with nothing spent outside the target's forwards, in either engine: the
    tokens per second of target forward time over no speculation's (where the method would be
    if drafting, sampling and bookkeeping cost nothing)."""
    if not (r.get("target_forward_s") and b.get("target_forward_s")):
        return None
    return (r["decode_tokens"] / r["target_forward_s"]) / (b["decode_tokens"] / b["target_forward_s"])


def environment() -> dict:
    import torch
    import vllm

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"machine": platform.node(), "cpu": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "gpu": gpu, "python": platform.python_version(),
            "torch": torch.__version__, "vllm": vllm.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


def _request(prompt: str, clip: Clip) -> dict:
    from vllm_sparrow.video import decode_video

    return {"prompt": prompt, "multi_modal_data": {"video": decode_video(clip.path)}}


def _cache_bytes(llm, method: str, rec: dict, cfg: BenchConfig) -> float:
    """Draft cache bytes per request, measured: Sparrow's ring tensors per slot; vLLM's draft KV
    (EAGLE, EAGLE-3) as the request's peak KV blocks times the draft layers' bytes per block."""
    if method == "sparrow" or (method in cfg.ablations and ablation_kind(cfg.ablations[method]) == "sparrow"):
        from vllm_sparrow.engine_stats import drafter_stats

        return float(drafter_stats(llm)["bytes_per_slot"])  # a request's fixed ring, whatever its length
    return rec["draft_kv_bytes_per_block"] * sum(rec["kv_blocks"]) / len(rec["kv_blocks"])


def _load_records(path: Path, cfg: BenchConfig) -> dict:
    """Finished (method, length, batch, round) records of an earlier run with the same settings."""
    settings_file = path.with_name("settings.json")
    settings = json.dumps(cfg.settings(), sort_keys=True)
    if settings_file.exists() and settings_file.read_text() != settings:
        raise SystemExit(f"{path.parent} holds a run with other settings; pick another --out or delete it")
    atomic_write_text(settings_file, settings)
    done = {}
    for r in read_jsonl(path):  # a record torn by a kill is cut off and measured again
        done[(r["method"], r["visual_tokens"], r["batch"], r["round"])] = r
    return done


def _line(r: dict) -> str:
    acc = f"acceptance {r['acceptance_length']:.2f}" if r.get("acceptance_length") else "acceptance -"
    tps = f"{r['decode_tok_s']:.1f} tok/s" if r.get("decode_tok_s") else "- tok/s"
    return (f"round {r['round'] + 1}: {r['method']:>8} @ {r['visual_tokens']:>6} visual tokens, batch {r['batch']:>3}: {acc}, decode {tps}, "
            + (f"caption word accuracy {r['caption_word_accuracy']:.3f}" if r.get("caption_word_accuracy") is not None
               else f"caption fact accuracy {r['caption_fact_accuracy']:.3f}"))
