"""Draft time of the mixed step: the engine step where a prompt's chunk joins decoding requests.

    python benchmarks/mixed_step.py [--k 3] [--rounds 3] [--prompt-tokens 600,3000] [--decodes 16]
                                    [--methods sparrow,eagle] [--models models/world] [--out runs/mixed-step]
    python benchmarks/mixed_step.py --quick     # smoke size: 1 round, a 200-token prompt, 4 decodes

Scenario: D video requests (demo clips at 512 visual tokens, the bench's captioning prompt) are
decoding when one text prompt of N tokens arrives; the next step carries the prompt's whole
chunk (the token budget lets it in at once) besides the D decodes, and the drafter gets both in
one call. Per method (a Sparrow draft, vLLM's EAGLE on the demo EAGLE draft, or none) and N, it
reports the draft time of that join step (timed around the drafter's propose, as `sparrow bench`
times it), the join step's wall time (engine step(), target included), and for reference the draft
time and wall time of the decode-only step of the same D requests just before. The in-process
engine is driven step by step (llm_engine.add_request / step), so the measured step is the one
that scheduled the prompt: each draft call is tagged with the tokens its step scheduled per
request, and the join step is the one whose draft call (or, for none, whose schedule) holds the
prompt's N tokens.

Each round opens every method's engine in turn (order reversed every other round, so drift in
the machine's speed does not favour one method), warms it on one unrecorded case, then measures
every N with fresh requests. Prefix caching is off: a round's prompts are computed in full, not
read from the previous round's cache. Writes <out>/results.json (the records, each value, the
medians, the environment, the settings and the command line) and <out>/table.md.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process: the timers reach the runner
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the demo kit, when run as a script

VISUAL_TOKENS = 512
WORDS = "there is a red circle , it moves left and the blue square stays still near the green triangle .".split()
LABEL = {"none": "no speculation", "sparrow": "Sparrow", "eagle": "EAGLE-1-style (vLLM eagle)",
         "eagle3": "EAGLE-3 (vLLM eagle3)"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="models/world", help="demo model folder: target, sparrow, eagle, eagle3")
    ap.add_argument("--methods", default="sparrow,eagle",
                    help="comma separated: sparrow, eagle, eagle3, none (none: step times only, no draft)")
    ap.add_argument("--k", type=int, default=3, help="speculative tokens of every method (the issue's table: 3)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, fresh requests and engines each")
    ap.add_argument("--prompt-tokens", default="600,3000", help="arriving prompt lengths N, comma separated")
    ap.add_argument("--decodes", type=int, default=16, help="video requests decoding when the prompt arrives")
    ap.add_argument("--dtype", default="float32", help="engine dtype (bfloat16 on a GPU)")
    ap.add_argument("--cuda-graphs", default="auto", choices=("auto", "on", "off"),
                    help="auto: on where the device is CUDA, off on CPU")
    ap.add_argument("--out", default="runs/mixed-step", help="writes OUT/results.json and OUT/table.md")
    ap.add_argument("--quick", action="store_true", help="smoke size: 1 round, N = 200, 4 decodes")
    args = ap.parse_args(argv)
    args.methods = tuple(m for m in args.methods.split(",") if m)
    args.prompt_tokens = tuple(int(x) for x in args.prompt_tokens.split(",") if x)
    if args.quick:
        args.rounds, args.prompt_tokens, args.decodes = 1, (200,), 4
    return args


def text_prompt_ids(tok, n: int, shift: int) -> list[int]:
    """A chat-templated text prompt (the bench's template, no media) of exactly n tokens: the
    template's head and tail around a body of repeated world words cut to length. Token ids, so
    the count is exact whatever the tiny vocabulary merges; `shift` rotates the words, so no two
    prompts of a run are alike."""
    from sparrow_world.tiny_targets import make_prompt

    head, tail = make_prompt("qwen2_5_vl", tok, "\x00", media=None).split("\x00")
    head_ids, tail_ids = (tok(t, add_special_tokens=False)["input_ids"] for t in (head, tail))
    room = n - len(head_ids) - len(tail_ids)
    if room < 1:
        raise SystemExit(f"--prompt-tokens {n}: the chat template alone takes {n - room} tokens")
    words = WORDS[shift % len(WORDS):] + WORDS[: shift % len(WORDS)]
    body: list[int] = []
    while len(body) < room:
        body += tok(" " + " ".join(words), add_special_tokens=False)["input_ids"]
    return head_ids + body[:room] + tail_ids


class ScheduleLog:
    """Every schedule of the engine's scheduler: when, and the tokens it gave each request."""

    def __init__(self, llm) -> None:
        scheduler = llm.llm_engine.engine_core.engine_core.scheduler
        self.entries: list[dict] = []
        inner = scheduler.schedule

        def schedule(*args, **kwargs):
            out = inner(*args, **kwargs)
            self.entries.append({"at": time.perf_counter(), "scheduled": dict(out.num_scheduled_tokens)})
            return out

        scheduler.schedule = schedule


class Case:
    """One measurement: D fresh video requests brought to decoding, a decode-only reference
    step, then the N-token prompt added and the step that carries it."""

    def __init__(self, llm, log: ScheduleLog, tag: str) -> None:
        self.llm, self.engine, self.log, self.tag = llm, llm.llm_engine, log, tag
        self.steps: list[tuple[float, float]] = []  # (start, end) perf_counter of every step()
        self.outputs: dict[str, list[int]] = {}  # external request id -> output token ids so far

    def step(self) -> None:
        start = time.perf_counter()
        for out in self.engine.step():
            self.outputs[out.request_id] = list(out.outputs[0].token_ids)
        self.steps.append((start, time.perf_counter()))

    def step_around(self, t: float) -> float:
        """Wall seconds of the step() that was running at perf_counter time t."""
        found = [b - a for a, b in self.steps if a <= t <= b]
        if len(found) != 1:
            raise RuntimeError(f"{self.tag}: {len(found)} engine steps around t = {t}")
        return found[0]


def run_case(llm, log: ScheduleLog, method: str, n: int, decodes: int, video_requests: list[dict],
             text_ids: list[int], k: int, tag: str) -> dict:
    from vllm import SamplingParams

    from sparrow_world.bench.engines import take_draft_calls

    case = Case(llm, log, tag)
    # ignore_eos: every video request is still decoding when the prompt arrives (a caption may
    # end within the steps taken); K + 1 tokens a step at most, ~10 steps per case
    video_params = SamplingParams(temperature=0.0, max_tokens=16 * (k + 1), ignore_eos=True)
    take_draft_calls(llm)
    log.entries.clear()
    video = {case.engine.add_request(f"{tag}-v{i}", r, video_params): f"{tag}-v{i}"
             for i, r in enumerate(video_requests[:decodes])}  # internal id -> external id
    for _ in range(64):  # prefills (chunked by the token budget), until every request decodes
        if all(case.outputs.get(ext) for ext in video.values()):
            break
        case.step()
    else:
        raise RuntimeError(f"{tag}: the video requests did not all reach decoding")
    for _ in range(2):  # decode-only steps, their drafts settled
        case.step()
    case.step()  # the reference: decode only
    text = case.engine.add_request(f"{tag}-t", {"prompt_token_ids": text_ids},
                                   SamplingParams(temperature=0.0, max_tokens=1))
    for _ in range(4):  # the join step (under async scheduling its draft may come a step() later)
        case.step()
        if case.outputs.get(f"{tag}-t"):
            break
    calls = take_draft_calls(llm)
    case.engine.abort_request(list(video), internal=True)
    while case.engine.has_unfinished_requests():
        case.engine.step()

    def scheduled(entry: dict) -> dict:
        s = entry["scheduled"]
        return {"prompt": s.get(text, 0), "decodes": sum(r in s for r in video),
                "decode_tokens": sum(s.get(r, 0) for r in video), "other": sorted(set(s) - set(video) - {text})}

    joins = [e for e in log.entries if text in e["scheduled"]]
    if not joins:
        raise RuntimeError(f"{tag}: the prompt was never scheduled")
    only = [e for e in log.entries if set(e["scheduled"]) == set(video) and e["at"] < joins[0]["at"]]
    if len(joins) != 1 or scheduled(joins[0])["prompt"] != n:
        raise RuntimeError(f"{tag}: the prompt was not scheduled in one chunk: {[scheduled(e) for e in joins]}")
    rec = {"method": method, "prompt_tokens": n, "decodes": decodes, "k": k, "tag": tag,
           "join": {"scheduled": scheduled(joins[0])}, "decode_only": {"scheduled": scheduled(only[-1])},
           "output_token_ids": {"video": [case.outputs.get(ext, []) for ext in video.values()],
                                "text": case.outputs.get(f"{tag}-t", [])}}
    if method == "none":
        rec["join"]["step_ms"] = 1000 * case.step_around(joins[0]["at"])
        rec["decode_only"]["step_ms"] = 1000 * case.step_around(only[-1]["at"])
        return rec
    join_calls = [c for c in calls if text in c["scheduled"]]
    ref_calls = [c for c in calls if set(c["scheduled"]) == set(video) and c["end"] < joins[0]["at"]]
    if len(join_calls) != 1 or not ref_calls:
        raise RuntimeError(f"{tag}: draft calls of the join step {len(join_calls)}, of decode-only steps "
                           f"{len(ref_calls)}")
    for part, call in (("join", join_calls[0]), ("decode_only", ref_calls[-1])):
        rec[part].update(draft_ms=1000 * call["seconds"], step_ms=1000 * case.step_around(call["start"]),
                         drafted_for=scheduled(call))
    return rec


def summarise(records: list[dict], methods: tuple[str, ...], lengths: tuple[int, ...]) -> list[dict]:
    """Per method and N: every round's value and the median."""
    rows = []
    for m in methods:
        for n in lengths:
            cell = [r for r in records if (r["method"], r["prompt_tokens"]) == (m, n)]
            row = {"method": m, "prompt_tokens": n, "rounds": len(cell)}
            for part, key in (("join", "draft_ms"), ("join", "step_ms"), ("decode_only", "draft_ms"),
                              ("decode_only", "step_ms")):
                values = [r[part][key] for r in cell if key in r[part]]
                if values:
                    row[f"{part}_{key}"] = {"values": values, "median": statistics.median(values)}
            rows.append(row)
    return rows


def table(summary: list[dict]) -> str:
    def cell(row: dict, key: str) -> str:
        v = row.get(key)
        if v is None:
            return "-"
        return f"{v['median']:.1f} (" + ", ".join(f"{x:.1f}" for x in v["values"]) + ")"

    header = ["method", "prompt tokens", "join step: draft ms", "join step: step ms", "decode-only step: draft ms",
              "decode-only step: step ms"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in summary:
        lines.append("| " + " | ".join([LABEL.get(row["method"], row["method"]), f"{row['prompt_tokens']:,}",
                                        cell(row, "join_draft_ms"), cell(row, "join_step_ms"),
                                        cell(row, "decode_only_draft_ms"), cell(row, "decode_only_step_ms")]) + " |")
    return "\n".join(lines) + "\n"


def prefixes_agree(records: list[dict]) -> bool | None:
    """Whether, case by case, every method's outputs so far agree with no speculation's of the same
    round where both have tokens (None without a none record): greedy speculation is lossless, so
    one output is a prefix of the other."""
    base = {(r["tag"].split("/")[0], r["prompt_tokens"]): r for r in records if r["method"] == "none"}
    if not base:
        return None
    for r in records:
        b = base.get((r["tag"].split("/")[0], r["prompt_tokens"]))
        if b is None or b is r:
            continue
        pairs = list(zip(r["output_token_ids"]["video"], b["output_token_ids"]["video"]))
        pairs.append((r["output_token_ids"]["text"], b["output_token_ids"]["text"]))
        if any(x[: min(len(x), len(y))] != y[: min(len(x), len(y))] for x, y in pairs):
            return False
    return True


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from transformers import AutoTokenizer

    from sparrow_world.bench.clips import eval_clips
    from sparrow_world.bench.config import BenchConfig
    from sparrow_world.bench.engines import close_engine, engine_settings, open_engine
    from sparrow_world.bench.run import environment
    from sparrow_world.tiny_targets import make_prompt
    from vllm_sparrow.durable import atomic_write_json, atomic_write_text
    from vllm_sparrow.video import decode_video

    t_start = time.perf_counter()
    out, models = Path(args.out), Path(args.models)
    out.mkdir(parents=True, exist_ok=True)
    cfg = BenchConfig(target=str(models / "target"), sparrow=str(models / "sparrow"), eagle=str(models / "eagle"),
                      eagle3=str(models / "eagle3"), out=str(out), num_speculative_tokens=args.k, dtype=args.dtype,
                      cuda_graphs=args.cuda_graphs)
    tok = AutoTokenizer.from_pretrained(cfg.target)
    video_prompt = make_prompt("qwen2_5_vl", tok, cfg.prompt, media="video")
    clips = eval_clips(out / "clips", (VISUAL_TOKENS,), args.decodes, cfg.seed0)[VISUAL_TOKENS]
    video_requests = [{"prompt": video_prompt, "multi_modal_data": {"video": decode_video(c.path)}} for c in clips]
    longest = max(args.prompt_tokens)
    budget = longest + args.decodes * (args.k + 1)  # the join step: the whole prompt and every decode's K + 1 rows
    engine_args = dict(max_model_len=max(VISUAL_TOKENS + 256, longest) + 16 * (args.k + 1) + 64,
                       max_num_batched_tokens=max(8192, budget + 64), max_num_seqs=args.decodes + 1,
                       enable_prefix_caching=False)
    records, engines = [], {}
    for rnd in range(args.rounds):
        order = args.methods if rnd % 2 == 0 else args.methods[::-1]
        lengths = args.prompt_tokens if rnd % 2 == 0 else args.prompt_tokens[::-1]
        for method in order:
            t0 = time.perf_counter()
            llm = open_engine(method, cfg, VISUAL_TOKENS, keep_calls=True, **engine_args)
            log = ScheduleLog(llm)
            print(f"[mixed-step] round {rnd + 1}/{args.rounds} {method}: engine up in {time.perf_counter() - t0:.0f}s",
                  flush=True)
            try:
                engines[method] = engine_settings(llm)
                run_case(llm, log, method, lengths[0], args.decodes, video_requests,
                         text_prompt_ids(tok, lengths[0], 1000 + rnd), args.k, f"r{rnd}/warm")  # not recorded
                for i, n in enumerate(lengths):
                    rec = run_case(llm, log, method, n, args.decodes, video_requests,
                                   text_prompt_ids(tok, n, 7 * rnd + i), args.k, f"r{rnd}/n{n}")
                    records.append({"round": rnd, **rec})
                    nan = float("nan")
                    print(f"[mixed-step]   {method} N={n}: join draft {rec['join'].get('draft_ms', nan):.1f} ms, "
                          f"join step {rec['join']['step_ms']:.1f} ms, decode-only draft "
                          f"{rec['decode_only'].get('draft_ms', nan):.1f} ms", flush=True)
            finally:
                close_engine(llm)
    summary = summarise(records, args.methods, args.prompt_tokens)
    settings = {**{k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(args).items()},
                "visual_tokens": VISUAL_TOKENS, "engine_args": engine_args, "engines": engines}
    command = ["python", "benchmarks/mixed_step.py", *(sys.argv[1:] if argv is None else argv)]
    data = {"environment": environment(), "settings": settings, "command_line": shlex.join(command),
            "seconds": time.perf_counter() - t_start, "outputs_agree_with_none": prefixes_agree(records),
            "summary": summary, "records": records}
    atomic_write_json(out / "results.json", data, indent=None)
    env = data["environment"]
    where = env["gpu"] or f"CPU only ({env['cpu_count']} cores, {env['cpu']})"
    text = (f"Measured {env['date']} on {where}; vLLM {env['vllm']}, torch {env['torch']}; K={args.k}, "
            f"{args.decodes} video requests ({VISUAL_TOKENS} visual tokens) decoding when an N-token text prompt "
            f"joins; median (each round) over {args.rounds} round(s).\n\n" + table(summary))
    atomic_write_text(out / "table.md", text)
    print(text, flush=True)
    print(f"[mixed-step] wrote {out / 'results.json'}, {out / 'table.md'} in {data['seconds']:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
