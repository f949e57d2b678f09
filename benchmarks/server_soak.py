"""A `vllm serve` under sustained mixed traffic: does its memory level off after warm-up?

    python benchmarks/server_soak.py [--methods none,sparrow,sparrow-release-off] [--warmup 3] [--rounds 60]
                                     [--phases 2] [--models models/world-hard] [--out runs/server-soak]
    python benchmarks/server_soak.py --quick     # smoke size: 1 warm-up round, 2 phases of 3 rounds

Per method (no speculation; Sparrow on the demo draft; Sparrow with the worker's release of freed
host memory turned off, vllm_sparrow/host_memory.py) it starts one real server on 127.0.0.1
(`--max-num-seqs 16 --max-model-len 8192`), warms it up, then runs `--phases` phases of `--rounds`
rounds with 16 requests in flight. One round: 9 greedy video chats (three clips x three questions,
every other one streamed), a text chat, a sampled video chat, a stream the client drops after its
first chunk, then 6 bad requests (each must get a 4xx). After each phase it reads the resident
memory (RSS) of every process of the server's tree from /proc, and samples the tree's total twice
a second during it (its peak), then lets the server settle (settle(): past the worker's release
interval, two short requests) and reads it again. The growth over the last phase is the number
that matters: a server
whose memory depends on how many requests it has served does not survive a million of them.

Every greedy answer of a method must equal its first round's (and no-speculation's, when both
run): a soak that changes answers is a bug, not a memory figure. Writes <out>/results.json (per
method: RSS per process after warm-up and after each phase, each phase's peak, answer checks,
requests and seconds per phase, vLLM's multi-modal cache drifts the client resent, the command
line) and <out>/table.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLIPS = ("world_32s.mp4", "world_96s.mp4", "world_384s.mp4")
QUESTIONS = ("Describe the video.", "What moves in the video?", "What colours are in the video?")
CONCURRENCY = 16
LABEL = {"none": "no speculation", "sparrow": "Sparrow",
         "sparrow-release-off": "Sparrow, SPARROW_HOST_MEMORY_RELEASE=off"}
METHOD_ENV = {"none": {}, "sparrow": {}, "sparrow-release-off": {"SPARROW_HOST_MEMORY_RELEASE": "off"}}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="models/world-hard", help="demo model folder: target, sparrow")
    ap.add_argument("--methods", default="none,sparrow,sparrow-release-off",
                    help="comma separated: none, sparrow, sparrow-release-off (Sparrow with "
                         "SPARROW_HOST_MEMORY_RELEASE=off: the worker keeps the allocator's free pages)")
    ap.add_argument("--videos", default="examples/videos", help="folder holding the three bundled clips")
    ap.add_argument("--warmup", type=int, default=3, help="rounds before the first reading")
    ap.add_argument("--rounds", type=int, default=60, help="rounds per phase")
    ap.add_argument("--phases", type=int, default=2, help="phases, memory read after each")
    ap.add_argument("--max-tokens", type=int, default=48, help="tokens per answer")
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--max-model-len", type=int, default=8192)
    ap.add_argument("--server-env", default="", help="extra KEY=VALUE,... for the server's environment")
    ap.add_argument("--out", default="runs/server-soak", help="writes OUT/results.json and OUT/table.md")
    ap.add_argument("--quick", action="store_true", help="smoke size: 1 warm-up round, 2 phases of 3 rounds")
    args = ap.parse_args(argv)
    args.methods = tuple(m for m in args.methods.split(",") if m)
    unknown = set(args.methods) - set(METHOD_ENV)
    if unknown:
        ap.error(f"unknown methods {sorted(unknown)}: use {', '.join(METHOD_ENV)}")
    if args.quick:
        args.warmup, args.rounds, args.phases = 1, 3, 2
    return args


# ---- the server ------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(args, method: str, media: Path, port: int) -> list[str]:
    target = str(Path(args.models) / "target")
    cmd = [str(Path(sys.executable).with_name("vllm")), "serve", target, "--host", "127.0.0.1",
           "--port", str(port), "--max-num-seqs", str(args.max_num_seqs), "--max-model-len", str(args.max_model_len),
           "--max-num-batched-tokens", "8192", "--dtype", "float32", "--enforce-eager",
           "--allowed-local-media-path", str(media),
           "--media-io-kwargs", json.dumps({"video": {"backend": "pyav"}}),
           "--limit-mm-per-prompt", json.dumps({"video": 1, "image": 1})]
    if method.startswith("sparrow"):
        cmd += ["--speculative-config", json.dumps({"method": "sparrow", "model": str(Path(args.models) / "sparrow")})]
    return cmd


def start_server(cmd: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    # The server as `vllm serve` runs it by default, engine core and workers in their own processes,
    # even when this script runs under the test suite (whose engines run in-process).
    full = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    with log.open("w") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**full, **env},
                                start_new_session=True)


def wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vllm serve exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise TimeoutError(f"vllm serve not healthy after {timeout}s:\n{log.read_text()[-4000:]}")


def stop_server(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)  # by process group: the API server and its engine core
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def tree_rss_mib(pid: int) -> dict[str, float]:
    """Resident memory (MiB) of pid and every descendant, keyed 'pid name'."""
    import psutil

    root = psutil.Process(pid)
    out = {}
    for p in [root, *root.children(recursive=True)]:
        try:
            out[f"{p.pid} {p.name()}"] = p.memory_info().rss / 2**20
        except psutil.NoSuchProcess:
            pass
    return out


class PeakSampler:
    """The highest total RSS of the server's tree, sampled twice a second while the block runs."""

    def __init__(self, pid: int, every_s: float = 0.5) -> None:
        import threading

        self.pid, self.every_s, self.peak = pid, every_s, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.peak = max(self.peak, sum(tree_rss_mib(self.pid).values()))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, sum(tree_rss_mib(self.pid).values()))


# ---- one round of traffic --------------------------------------------------------------------
def round_requests(clips: list[str], outside: str) -> list[dict]:
    """One round: (kind, request kwargs) with kind greedy / text / sampled / dropped / bad."""
    video = lambda url, q: [{"type": "video_url", "video_url": {"url": url}}, {"type": "text", "text": q}]  # noqa: E731
    reqs = []
    for i, (c, q) in enumerate((c, q) for c in clips for q in QUESTIONS):
        reqs.append(dict(kind="greedy", key=f"{i}", content=video(c, q), stream=i % 2 == 1, temperature=0.0))
    reqs.append(dict(kind="text", key="text", content="What is a video caption?", stream=False, temperature=0.0))
    reqs.append(dict(kind="sampled", content=video(clips[0], QUESTIONS[0]), stream=False, temperature=0.8))
    reqs.append(dict(kind="dropped", content=video(clips[1], QUESTIONS[0]), stream=True, temperature=0.0))
    junk = "data:video/mp4;base64," + "AAAAbnVuaw==" * 20
    for content, extra in ((video(junk, "x"), {}), (video(outside, "x"), {}), ("word " * 9000, {}),
                           ([{"type": "text", "text": "   "}], {}), ("hi", {"temperature": -1.0}),
                           ("hi", {"max_tokens": 100_000})):
        reqs.append(dict(kind="bad", content=content, stream=False, temperature=extra.get("temperature", 0.0),
                         max_tokens=extra.get("max_tokens")))
    return reqs


async def _one(client, model: str, req: dict, max_tokens: int):
    import openai

    kw = dict(model=model, messages=[{"role": "user", "content": req["content"]}],
              max_tokens=req.get("max_tokens") or max_tokens, temperature=req["temperature"])
    try:
        if not req["stream"]:
            return (await client.chat.completions.create(**kw)).choices[0].message.content
        stream = await client.chat.completions.create(stream=True, **kw)
        pieces = []
        async for chunk in stream:
            if chunk.choices:
                pieces.append(chunk.choices[0].delta.content or "")
            if req["kind"] == "dropped" and pieces:
                await stream.close()  # the client goes away mid-answer
                return None
        return "".join(pieces)
    except openai.APIStatusError as e:
        return e


async def run_rounds(url: str, model: str, reqs: list[dict], rounds: int, max_tokens: int) -> list[list]:
    import openai

    sem = asyncio.Semaphore(CONCURRENCY)
    # The openai client's default retries, as users run it: vLLM answers a request that met its
    # multi-modal cache drift (P0/P1) with a retryable 500 and expects the client to resend it.
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", timeout=600) as client:
        async def bounded(req):
            async with sem:
                return await _one(client, model, req, max_tokens)

        tasks = [[asyncio.ensure_future(bounded(r)) for r in reqs] for _ in range(rounds)]
        return [list(await asyncio.gather(*t)) for t in tasks]


def settle(url: str, model: str) -> None:
    """Let the server come to rest before a settled reading: wait past the worker's release
    interval (vllm_sparrow.host_memory), then two short requests one after the other (the worker
    learns that the first finished in the second's first step, where a due release runs). A server
    without Sparrow gets the same two requests."""
    import openai

    from vllm_sparrow.host_memory import DEFAULT_INTERVAL_S

    time.sleep(DEFAULT_INTERVAL_S + 1)
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", timeout=120)
    for _ in range(2):
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                       temperature=0.0)


def check_round(reqs: list[dict], answers: list, reference: dict[str, str]) -> list[str]:
    """Problems in one round's answers; fills reference (greedy key -> answer) on first sight."""
    import openai

    problems = []
    for req, ans in zip(reqs, answers):
        if req["kind"] == "bad":
            if not (isinstance(ans, openai.APIStatusError) and 400 <= ans.status_code < 500):
                problems.append(f"bad request answered {ans!r:.200}")
        elif isinstance(ans, Exception):
            problems.append(f"{req['kind']} request failed: {ans!s:.300}")
        elif req["kind"] in ("greedy", "text"):
            if reference.setdefault(req["key"], ans) != ans:
                problems.append(f"greedy answer {req['key']} changed: {ans!r:.80} != {reference[req['key']]!r:.80}")
    return problems


# ---- a method's soak -------------------------------------------------------------------------
def soak(args, method: str, out: Path) -> dict:
    videos = (ROOT / args.videos).resolve()
    clips = [(videos / c).as_uri() for c in CLIPS]
    outside = (ROOT / "models" / "world-hard" / "README.md").resolve().as_uri()  # not under the media path
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"), **METHOD_ENV[method]}
    env.update(dict(kv.split("=", 1) for kv in args.server_env.split(",") if kv))
    cmd = server_command(args, method, videos, port)
    proc = start_server(cmd, out / f"server-{method}.log", env)
    reqs = round_requests(clips, outside)
    reference: dict[str, str] = {}
    record = {"method": method, "server": shlex.join(cmd), "phases": [], "problems": []}
    try:
        wait_healthy(url, proc, out / f"server-{method}.log")
        model = cmd[2]
        t0 = time.time()
        answers = asyncio.run(run_rounds(url, model, reqs, args.warmup, args.max_tokens))
        for a in answers:
            record["problems"] += check_round(reqs, a, reference)
        record["warmup"] = {"rounds": args.warmup, "seconds": time.time() - t0, "rss_mib": tree_rss_mib(proc.pid)}
        settle(url, model)
        record["warmup"]["settled_mib"] = tree_rss_mib(proc.pid)
        print(f"{method}: warm-up {args.warmup} rounds, {sum(record['warmup']['rss_mib'].values()):.0f} MiB", flush=True)
        for phase in range(args.phases):
            t0 = time.time()
            with PeakSampler(proc.pid) as peak:
                answers = asyncio.run(run_rounds(url, model, reqs, args.rounds, args.max_tokens))
            for a in answers:
                record["problems"] += check_round(reqs, a, reference)
            rss, seconds = tree_rss_mib(proc.pid), time.time() - t0
            settle(url, model)
            record["phases"].append({"rounds": args.rounds, "requests": args.rounds * len(reqs), "seconds": seconds,
                                     "rss_mib": rss, "settled_mib": tree_rss_mib(proc.pid), "peak_mib": peak.peak})
            print(f"{method}: phase {phase + 1}: {args.rounds * len(reqs)} requests in {time.time() - t0:.0f} s, "
                  f"{sum(rss.values()):.0f} MiB", flush=True)
        record["answers"] = reference
    finally:
        stop_server(proc)
    # vLLM's own retryable multi-modal cache misses (the client resent those requests).
    record["mm_cache_drift"] = (out / f"server-{method}.log").read_text().count("P0/P1 cache drift")
    return record


def growth(record: dict) -> list[float]:
    """MiB the server's process tree grew over each phase (its RSS at the phase's end less at the
    previous end, the first against the end of warm-up)."""
    total = [sum(record["warmup"]["rss_mib"].values())] + [sum(p["rss_mib"].values()) for p in record["phases"]]
    return [b - a for a, b in zip(total, total[1:])]


def settled_growth(record: dict) -> list[float] | None:
    """MiB the server tree's settled RSS (read after settle()) grew over each phase; None for a
    run recorded before settled readings were taken."""
    if "settled_mib" not in record["warmup"]:
        return None
    total = [sum(record["warmup"]["settled_mib"].values())] + [sum(p["settled_mib"].values()) for p in record["phases"]]
    return [b - a for a, b in zip(total, total[1:])]


def engine_settled_growth(record: dict) -> list[float] | None:
    """MiB the engine's processes (vLLM's engine core and its worker, named VLLM::*) grew over each
    phase, settled. The drafter runs there; the API server in front of them runs the same code with
    and without speculation and its RSS moves by tens of MiB either way (request objects, the
    front end's media and tokenizer caches), so the engine's figure is the one a method moves."""
    if "settled_mib" not in record["warmup"]:
        return None
    total = [engine_mib(record["warmup"]["settled_mib"])] + [engine_mib(p["settled_mib"]) for p in record["phases"]]
    return [b - a for a, b in zip(total, total[1:])]


def engine_mib(rss: dict[str, float]) -> float:
    return sum(v for name, v in rss.items() if name.split(" ", 1)[1].startswith("VLLM::"))


def peak_growth(record: dict) -> list[float]:
    """MiB the server tree's peak RSS in each phase after the first exceeds the previous phase's."""
    peaks = [p["peak_mib"] for p in record["phases"]]
    return [b - a for a, b in zip(peaks, peaks[1:])]


def table(records: list[dict]) -> str:
    phases = len(records[0]["phases"])
    settled = all(settled_growth(r) is not None for r in records)
    head = ("| server | " + " | ".join(f"phase {i + 1} growth (MiB)" for i in range(phases))
            + (" | settled, per phase (MiB) | engine processes, settled (MiB)" if settled else "")
            + " | peak, phase over phase (MiB) | seconds per phase | resent (vLLM mm-cache drift) |")
    lines = [head, "|" + "---|" * (phases + 4 + 2 * settled)]
    for r in records:
        g = " | ".join(f"{x:+.0f}" for x in growth(r))
        st = "".join(" | " + " / ".join(f"{x:+.0f}" for x in f(r))
                     for f in (settled_growth, engine_settled_growth)) if settled else ""
        pk = " / ".join(f"{x:+.0f}" for x in peak_growth(r)) or "-"
        secs = " / ".join(f"{p['seconds']:.0f}" for p in r["phases"])
        lines.append(f"| {LABEL.get(r['method'], r['method'])} | {g}{st} | {pk} | {secs} | {r['mm_cache_drift']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    records = [soak(args, m, out) for m in args.methods]
    if len(records) > 1:  # every method answers greedy requests as no speculation does
        base = records[0]["answers"]
        for r in records[1:]:
            r["equal_to_" + records[0]["method"]] = r["answers"] == base
    result = {"command_line": shlex.join([sys.executable, *sys.argv]), "settings": vars(args) | {"methods": list(args.methods)},
              "records": records, "growth_mib": {r["method"]: growth(r) for r in records},
              "peak_growth_mib": {r["method"]: peak_growth(r) for r in records},
              "settled_growth_mib": {r["method"]: settled_growth(r) for r in records},
              "engine_settled_growth_mib": {r["method"]: engine_settled_growth(r) for r in records}}
    (out / "results.json").write_text(json.dumps(result, indent=1))
    (out / "table.md").write_text(table(records))
    print(table(records))
    bad = [p for r in records for p in r["problems"]] + \
        [f"{r['method']}: greedy answers differ from none's" for r in records if r.get("equal_to_none") is False]
    if bad:
        print("problems:", *bad[:20], sep="\n  ", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
