"""Every published benchmark number: its command, its JSON, and the tables made from it.

    python benchmarks/publish.py run NAME [NAME ...]   # run NAME's command (its --out emptied first: one run); keep
                                                       # its JSON; render. --resume: go on with an unfinished run
    python benchmarks/publish.py render                 # rewrite every published table and plot from the JSONs
    python benchmarks/publish.py check                  # exit 1 where a table differs from its JSON

RUNS holds each published run's command (run from the repository root, about the minutes given
on this repository's 2-core CPU); its results.json (records with the output token ids, the
machine, versions and settings) is kept as benchmarks/results/NAME.json with the command added.
A table in README.md or docs/ lives between `<!-- published: VIEW -->` and `<!-- /published -->`
and is rewritten from the JSONs by VIEWS[VIEW]; benchmarks/results/NAME.md is NAME's whole
table. tests/test_published_numbers_come_from_their_files.py runs `check`.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the demo kit's report, when run as a script
RESULTS = ROOT / "benchmarks" / "results"
DRAFT = "models/world/sparrow"
HARD = "models/world-hard/sparrow"

# name -> (command, minutes here). Each writes <its --out>/results.json. A bench command names its
# --k: the bench's default is the Sparrow draft's recommended depth (8 for the shipped draft), and
# these runs were measured at K = 3 (their settings record it).
RUNS = {
    "k3": ("sparrow bench --world easy --with-ablations --k 3 --out runs/published/k3", 20),
    "batch": ("sparrow bench --world easy --lengths 512,6144 --batch-sizes 1,4,16 --methods sparrow,eagle,eagle3 --k 3 "
              "--out runs/published/batch", 4),
    "depth-b1": ("sparrow bench --world easy --lengths 512,6144,24960 --methods none --batch-sizes 1 --k 3 "
                 f"--ablation k3={DRAFT}@3 --ablation k8={DRAFT}@8 --ablation adaptive={DRAFT}@8,stop_confidence=0.7 "
                 "--out runs/published/depth-b1", 8),
    "depth-b16": ("sparrow bench --world easy --lengths 512,6144 --methods none --batch-sizes 16 --k 3 "
                  f"--ablation k3={DRAFT}@3 --ablation k8={DRAFT}@8 --ablation adaptive={DRAFT}@8,stop_confidence=0.7 "
                  "--out runs/published/depth-b16", 6),
    "mixed-step": ("python benchmarks/mixed_step.py --k 3 --rounds 5 --prompt-tokens 600,3000 --methods sparrow,eagle "
                   "--out runs/published/mixed-step", 3),
    "k8-all": ("sparrow bench --world easy --lengths 512,6144,24960 --methods sparrow,eagle,eagle3 --k 8 "
               "--out runs/published/k8-all", 8),
    "tree-search": ("sparrow bench --world easy --lengths 512,6144 --methods sparrow --batch-sizes 1,4 --k 4 "
                    f"--ablation tree3={DRAFT}@4,tree_topk=3 --out runs/published/tree-search", 4),
    "tree-replay": ("python benchmarks/tree_replay.py --world easy --lengths 512,6144,17408 --clips 4 "
                    "--out runs/published/tree-replay", 10),
    "op-count": ("python benchmarks/op_count.py --out runs/published/op-count", 2),
    # 9 repeats a length: at 3, one length's repeats spread by a fifth on a noisy day (2026-12-06).
    "draft-step-cache": ("python benchmarks/draft_step_cache.py --repeats 9 --out runs/published/draft-step-cache", 2),
    # A real `vllm serve` of the hard world under two phases of 60 rounds of mixed traffic (docs/serving.md).
    "server-soak": ("python benchmarks/server_soak.py --out runs/published/server-soak", 14),
    # The same server under six shorter phases: when does each method's memory level off?
    "server-soak-long": ("python benchmarks/server_soak.py --methods none,sparrow --rounds 30 --phases 6 "
                         "--out runs/published/server-soak-long", 13),
    "capture-speed": ("python benchmarks/capture_speed.py --batches 1,8,16 --out runs/published/capture-speed", 4),
    "ivsb-keep": ("python benchmarks/ivsb_keep.py --out runs/published/ivsb-keep", 15),
    # Issue 45: does training more MTP stages than the build's 2 help the positions a depth-16 chain reaches?
    "hard-mtp-depth": ("python benchmarks/mtp_depth.py --world hard --mtp 2,4,7 --seeds 0,1 --k 16 "
                       "--out runs/published/hard-mtp-depth", 20),
    # The hard world (docs/benchmarks.md, "The two demo worlds"): the issue-29 calibration's K = 5.
    "hard-k5": ("sparrow bench --world hard --k 5 --methods none,sparrow,eagle,eagle3 "
                "--out runs/published/hard-k5", 30),
    "hard-tree-replay": ("python benchmarks/tree_replay.py --world hard --lengths 512,6144,17408,24960 --clips 4 "
                         "--chains 8,16,32 --trees 8,16,32 --search-depth 8 --temperature 0.7 "
                         "--out runs/published/hard-tree-replay", 30),
    "hard-ablations": ("sparrow bench --world hard --k 5 --methods none,sparrow --with-ablations "
                       "--lengths 512,6144,24960 --clips 4 --rounds 1 --out runs/published/hard-ablations", 15),
    "hard-batch": ("sparrow bench --world hard --lengths 512,6144 --batch-sizes 1,4,16 --methods sparrow,eagle,eagle3 "
                   "--k 5 --out runs/published/hard-batch", 15),
    # What `sparrow tune` recommends for the hard draft on this machine, from the tree replay's
    # held-out 6,144-token captures (run hard-tree-replay first), written into a copy of the draft
    # (runs/published/hard-tune/draft) that hard-depth serves beside fixed depths.
    "hard-tune": ("python benchmarks/tuned_draft.py --draft models/world-hard/sparrow "
                  "--capture runs/published/hard-tree-replay/cap-6144 --data runs/published/hard-tree-replay/data-6144.jsonl "
                  "--samples 4 --batch-sizes 1,4,16 --out runs/published/hard-tune", 8),
    # Issue 45's depth table: Sparrow and both baselines at depths 5-16, and the depth per batch size
    # `sparrow tune` chose (run hard-tune first), at batch 1, 4 and 16. One round: 14 engines a cell.
    "hard-depth": ("sparrow bench --world hard --lengths 512,24960 --batch-sizes 1,4,16 --methods none --k 5 --rounds 1 "
                   + " ".join(f"--ablation sparrow-{k}={HARD}@{k} --ablation eagle-{k}=eagle@{k} "
                              f"--ablation eagle3-{k}=eagle3@{k}" for k in (5, 8, 12, 16))
                   + " --ablation tuned=runs/published/hard-tune/draft@auto --out runs/published/hard-depth", 70),
    # Issue 45's verdict on sparrow tune: the tuned copy (run hard-tune first) beside Sparrow at every
    # fixed depth of hard-depth, Sparrow alone, at the length tune measured its costs at, in seven
    # rounds whose order changes (each method's own engine every round; tuned is compared with each
    # depth within a round, paired_ratio): one engine start a cell, as hard-depth has, cannot rank
    # depths on a machine whose starts vary, and three rounds did not order the fixed depths at all
    # (2026-12-06).
    "hard-tune-vs-fixed": ("sparrow bench --world hard --lengths 6144 --batch-sizes 1,4,16 --methods none --k 5 "
                           "--rounds 7 " + " ".join(f"--ablation sparrow-{k}={HARD}@{k}" for k in (5, 8, 12, 16))
                           + " --ablation tuned=runs/published/hard-tune/draft@auto "
                           "--out runs/published/hard-tune-vs-fixed", 32),
    # IVSB on the hard world (ivsb-keep is the easy world's): which visual-state samples to keep.
    "hard-ivsb-keep": ("python benchmarks/ivsb_keep.py --world hard --k 5 --out runs/published/hard-ivsb-keep", 20),
    # Acceptance against length with 6 scenes a length (hard-k5 has 2): one round, speed aside.
    "hard-k5-clips6": ("sparrow bench --world hard --k 5 --methods none,sparrow,eagle --clips 6 --rounds 1 "
                       "--out runs/published/hard-k5-clips6", 15),
    # Issue 47's flatness: 16 scenes a length none of the other runs drew, each paired with itself at
    # 512 visual tokens. 16 from the first run on the rebuilt world (sd 0.04 over 4 scenes: (1.96 * 0.04
    # / 0.02)^2 = 16 for a +-2% interval); this run's spread is wider, and its table says how many a
    # +-2% interval needs. One round beside other runs: acceptance only, its timings are not read.
    "hard-scenes": ("sparrow bench --world hard --k 5 --methods none,sparrow,eagle,eagle3 --lengths 512,17408,24960 "
                    "--clips 16 --rounds 1 --seed0 30000200 --out runs/published/hard-scenes", 50),
    # Flatness on 8 scenes none of the runs above drew (--seed0 past theirs): an independent sample.
    "hard-k5-new-scenes": ("sparrow bench --world hard --k 5 --methods none,sparrow --lengths 512,17408,24960 "
                           "--clips 8 --rounds 1 --seed0 30000100 --out runs/published/hard-k5-new-scenes", 25),
}
LABEL = {"sparrow": "Sparrow", "eagle": "EAGLE-1-style", "eagle3": "EAGLE-3"}


def load(name: str) -> dict:
    return json.loads((RESULTS / f"{name}.json").read_text())


# ---- bench records ------------------------------------------------------------------
def _cell(data: dict, method: str, n: int, b: int = 1) -> dict:
    found = [r for r in data["records"] if (r["method"], r["visual_tokens"], r["batch"]) == (method, n, b)]
    if len(found) != 1:
        raise KeyError(f"{method} at {n} visual tokens, batch {b}: {len(found)} records")
    return found[0]


def speedup(data: dict, r: dict) -> float:
    """Decode throughput over no speculation's, same length and batch, same run."""
    return r["decode_tok_s"] / _cell(data, "none", r["visual_tokens"], r["batch"])["decode_tok_s"]


def equal_outputs(data: dict, r: dict) -> bool:
    """Token for token the outputs of no speculation, same clips, same run."""
    return r["output_token_ids"] == _cell(data, "none", r["visual_tokens"], r["batch"])["output_token_ids"]


def _lengths(data: dict) -> list[int]:
    return sorted({r["visual_tokens"] for r in data["records"]})


def _n(n: int) -> str:
    return f"{n:,}"


def _source(*names: str) -> str:
    parts = []
    for name in names:
        env = load(name)["environment"]
        where = env["gpu"] or f"CPU only, {env['cpu_count']} cores"
        parts.append(f"`{load(name)['command']}` (`benchmarks/results/{name}.json`, {env['date']}, {where}, "
                     f"vLLM {env['vllm']})")
    return "Measured by " + "; ".join(parts) + "."


def _files(*names: str) -> str:
    """The short form of _source for README: the JSONs and when they were measured."""
    return "(" + ", ".join(f"`benchmarks/results/{n}.json`, {load(n)['environment']['date'][:10]}" for n in names) + \
        "; commands in docs/benchmarks.md)"


def _equality(*names: str) -> str:
    bad = [f"{r['method']} at {r['visual_tokens']}, batch {r['batch']}" for name in names for data in [load(name)]
           for r in data["records"] if "output_token_ids" in r and r["method"] != "none" and not equal_outputs(data, r)]
    return "Outputs equal no speculation's, token for token, in every cell." if not bad else \
        f"OUTPUTS DIFFER from no speculation's: {', '.join(bad)}."


def _table(header: list[str], rows: list[list[str]]) -> str:
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                     + ["| " + " | ".join(r) + " |" for r in rows])


# ---- views --------------------------------------------------------------------------
def readme_k3() -> str:
    return _methods_table("k3")


def readme_hard() -> str:
    return _methods_table("hard-k5")


def _methods_table(name: str) -> str:
    """Acceptance / draft ms / speedup of the three drafting methods per length, batch 1."""
    data = load(name)
    rows = []
    for n in _lengths(data):
        row = [_n(n)]
        for m in ("sparrow", "eagle", "eagle3"):
            r = _cell(data, m, n)
            row.append(f"{r['acceptance_length']:.2f} / {r['draft_ms_per_step']:.2f} / {speedup(data, r):.2f}x")
        rows.append(row)
    header = ["visual tokens", "Sparrow", "EAGLE-1-style (vLLM `eagle`)", "EAGLE-3 (vLLM `eagle3`)"]
    return _table(header, rows) + "\n\n" + _equality(name) + " " + _files(name)


def readme_depth() -> str:
    b1, k8 = load("depth-b1"), load("k8-all")
    lengths = _lengths(b1)
    acc = [_cell(b1, "k8", n)["acceptance_length"] for n in lengths]
    sp = [speedup(b1, _cell(b1, "k8", n)) for n in lengths]
    sp3 = [speedup(b1, _cell(b1, "k3", n)) for n in lengths]
    first, last = lengths[0], lengths[-1]
    base = {m: (speedup(k8, _cell(k8, m, first)), speedup(k8, _cell(k8, m, last)))
            for m in ("sparrow", "eagle", "eagle3")}
    return (f"At the easy world draft's recommended depth, K = 8, it accepts {min(acc):.2f}-{max(acc):.2f} tokens "
            f"per step and decodes {min(sp):.2f}-{max(sp):.2f}x faster than no speculation at {_n(first)} to {_n(last)} visual "
            f"tokens (K = 3: {min(sp3):.2f}-{max(sp3):.2f}x), batch 1; in another run at K = 8, decode speedup at "
            f"{_n(first)} / {_n(last)} visual tokens: "
            + ", ".join(f"{LABEL[m]} {a:.2f}x / {b:.2f}x" for m, (a, b) in base.items())
            + f" {_files('depth-b1', 'k8-all')}.")


def readme_cache() -> str:
    return _flatness("k3")


def readme_hard_cache() -> str:
    """The hard world's flatness over many scenes (hard-scenes) beside the table's own 2-scene move,
    and how each draft's cache grows with the video (hard-k5)."""
    scenes = load("hard-scenes")
    lengths = _lengths(scenes)
    mean, se, _ = _spread_of(scene_ratios(scenes, "sparrow", lengths[-1], lengths[0]))
    n = len(_cell(scenes, "sparrow", lengths[0])["per_clip"])
    return (f"Over {n} scenes a length, each paired with itself, Sparrow accepts at {_n(lengths[-1])} visual tokens "
            f"{mean:.3f} +- {se:.3f} (mean +- s.e.) of what it accepts at {_n(lengths[0])} "
            f"{_files('hard-scenes')}. " + _flatness("hard-k5").replace("Sparrow's acceptance moves",
                                                                        "In the 2-scene table above its acceptance moves"))


def _flatness(name: str) -> str:
    """How Sparrow's acceptance and draft cache move with the video against EAGLE's draft KV."""
    data = load(name)
    first, last = _lengths(data)[0], _lengths(data)[-1]
    s0, s1 = _cell(data, "sparrow", first)["acceptance_length"], _cell(data, "sparrow", last)["acceptance_length"]
    ring = _cell(data, "sparrow", last)["draft_cache_bytes"] / 1024
    e0, e1 = (_cell(data, "eagle", n)["draft_cache_bytes"] / 2**20 for n in (first, last))
    return (f"Sparrow's acceptance moves {100 * (s1 - s0) / s0:+.1f}% from {_n(first)} to {_n(last)} visual tokens, and "
            f"its draft cache is one fixed {ring:.1f} KiB ring per request at every length, while the KV vLLM keeps "
            f"for EAGLE's draft grows from {e0:.2f} to {e1:.2f} MiB per request {_files(name)}.")


def hard_flatness() -> str:
    """Acceptance per length relative to 512 visual tokens, each method, in the hard K = 5 runs on
    the target before its long stage ("-": a length that run did not measure)."""
    runs = ("hard-k5-clips6", "hard-k5-new-scenes")
    header_lengths = _lengths(load("hard-k5-clips6"))
    rows = []
    for name in runs:
        data = load(name)
        lengths, clips = _lengths(data), data["settings"]["clips_per_length"]
        for m in ("sparrow", "eagle"):
            if not any(r["method"] == m for r in data["records"]):
                continue  # the new-scenes run has no EAGLE-style draft
            acc = {n: _cell(data, m, n)["acceptance_length"] for n in lengths}
            first, last = acc[header_lengths[0]], acc[header_lengths[-1]]
            rows.append([f"{clips}", LABEL[m]] + [f"{acc[n]:.2f}" if n in acc else "-" for n in header_lengths]
                        + [f"{last / first:.3f}", f"{min(acc.values()) / first:.3f}"])
    rows.append(_pooled_flatness(("hard-k5-clips6", "hard-k5-new-scenes"), header_lengths))
    header = ["scenes a length", "method"] + [_n(n) for n in header_lengths] + ["last / first", "lowest / first"]
    return _table(header, rows) + "\n\n" + _equality(*runs) + " " + _source(*runs)


def _pooled_flatness(runs: tuple[str, ...], header_lengths: list[int]) -> list[str]:
    """Sparrow's row over runs that drew disjoint scenes: 1 + accepted / drafts summed over them,
    at the lengths every one of them measured."""
    datas = [load(name) for name in runs]
    lengths = [n for n in header_lengths if all(n in _lengths(d) for d in datas)]
    cells = {n: [_cell(d, "sparrow", n) for d in datas] for n in lengths}
    acc = {n: 1 + sum(c["accepted"] for c in cs) / sum(c["drafts"] for c in cs) for n, cs in cells.items()}
    first, last = acc[header_lengths[0]], acc[header_lengths[-1]]
    scenes = " + ".join(str(d["settings"]["clips_per_length"]) for d in datas)
    return ([f"{scenes}, pooled", LABEL["sparrow"]] + [f"{acc[n]:.2f}" if n in acc else "-" for n in header_lengths]
            + [f"{last / first:.3f}", f"{min(acc.values()) / first:.3f}"])


def _scene_acceptance(clip: dict) -> float:
    return 1 + clip["accepted"] / clip["drafts"] if clip["drafts"] else float("nan")


def scene_ratios(data: dict, method: str, n: int, base: int) -> list[float]:
    """Each scene's acceptance length at n visual tokens over its own at `base` (the same scene
    stretched: clip i of every length), from the bench's per-clip counters (batch 1)."""
    at, first = _cell(data, method, n)["per_clip"], _cell(data, method, base)["per_clip"]
    return [_scene_acceptance(a) / _scene_acceptance(b) for a, b in zip(at, first)]


def _spread_of(ratios: list[float]) -> tuple[float, float, int]:
    """Mean, standard error and the scenes a 95% interval of +-2% needs, of per-scene ratios."""
    import math
    import statistics

    sd = statistics.stdev(ratios) if len(ratios) > 1 else float("nan")
    return statistics.fmean(ratios), sd / math.sqrt(len(ratios)), math.ceil((1.96 * sd / 0.02) ** 2)


def hard_scenes() -> str:
    """Acceptance against length over many scenes, each scene paired with itself at 512 visual
    tokens: pooled acceptance length per method and length, the per-scene ratio's mean with its
    standard error, and how many scenes a +-2% interval needs (the spread between scenes is the
    noise a flatness claim has to beat)."""
    data = load("hard-scenes")
    lengths = _lengths(data)
    base = lengths[0]
    rows = []
    for m in ("sparrow", "eagle", "eagle3"):
        for n in lengths:
            r = _cell(data, m, n)
            mean, se, need = _spread_of(scene_ratios(data, m, n, base))
            rows.append([LABEL[m], _n(n), str(len(r["per_clip"])), f"{r['acceptance_length']:.2f}",
                         "-" if n == base else f"{mean:.3f} +- {se:.3f}", "-" if n == base else str(need)])
    header = ["method", "visual tokens", "scenes", "acceptance length (pooled)",
              f"per scene, over its own at {_n(base)} (mean +- s.e.)", "scenes for +-2% (95%)"]
    return _table(header, rows) + "\n\n" + _equality("hard-scenes") + " " + _source("hard-scenes")


DEPTHS = (5, 8, 12, 16)  # hard-depth's fixed depths


def hard_depth_table() -> str:
    """Issue 45's depth table: every method at depths 5-16 beside sparrow tune's choice, per
    batch size and length: decode speedup (acceptance length; share of the decode phase outside
    the target's forward)."""
    data = load("hard-depth")
    rows = []
    for n in _lengths(data):
        for b in sorted({r["batch"] for r in data["records"]}):
            for k in DEPTHS:
                cells = [_cell(data, f"{m}-{k}", n, b) for m in ("sparrow", "eagle", "eagle3")]
                rows.append([_n(n), str(b), str(k)] + [_depth_cell(data, r) for r in cells])
            tuned = _cell(data, "tuned", n, b)
            rows.append([_n(n), str(b), f"tuned ({tuned['draft_tokens'] / tuned['drafts']:.1f})",
                         _depth_cell(data, tuned), "", ""])
    header = ["visual tokens", "batch", "depth", "Sparrow", "EAGLE-1-style", "EAGLE-3"]
    return _table(header, rows) + "\n\n" + _tuned_verdict(data) + " " + _equality("hard-depth") + " " + \
        _source("hard-depth")


def _depth_cell(data: dict, r: dict) -> str:
    return (f"{speedup(data, r):.2f}x ({r['acceptance_length']:.2f}; "
            f"{r['outside_forward_share']:.2f})")


def _tuned_verdict(data: dict) -> str:
    """Whether tune's choice decodes no slower than every fixed Sparrow depth at each batch size
    (decode tokens per second, summed over the lengths), said either way."""
    parts, held = [], True
    for b in sorted({r["batch"] for r in data["records"]}):
        lengths = _lengths(data)
        rate = {m: sum(_cell(data, m, n, b)["decode_tok_s"] for n in lengths)
                for m in ["tuned"] + [f"sparrow-{k}" for k in DEPTHS]}
        best = max((m for m in rate if m != "tuned"), key=rate.get)
        ok = rate["tuned"] >= rate[best]
        held &= ok
        summed = " summed over the lengths" if len(lengths) > 1 else ""
        parts.append(f"batch {b}: tuned {rate['tuned']:.0f} against the best fixed depth ({best.split('-')[1]}) "
                     f"{rate[best]:.0f} decode tokens/s{summed}")
    return ("sparrow tune's choice decodes no slower than every fixed depth at every batch size" if held else
            "sparrow tune's choice is NOT the fastest at every batch size") + f" ({'; '.join(parts)})."


def hard_tune_vs_fixed() -> str:
    """Issue 45's verdict on sparrow tune: per batch size, Sparrow's decode tokens/s at each fixed
    depth and at tune's choice, median (min-max) over interleaved rounds, acceptance length after."""
    data, schedule = load("hard-tune-vs-fixed"), load("hard-tune")["schedule"]
    depth_at = {b: d for lo, hi, d in schedule for b in range(lo, hi + 1)}
    methods = [f"sparrow-{k}" for k in DEPTHS] + ["tuned"]
    rows = []
    for n in _lengths(data):
        for b in sorted({r["batch"] for r in data["records"]}):
            cells = [_cell(data, m, n, b) for m in methods]
            rows.append([_n(n), str(b), str(depth_at.get(b, schedule[-1][2]))] + [_rate_cell(r) for r in cells])
    header = ["visual tokens", "batch", "depth tune chose"] + [f"depth {k}" for k in DEPTHS] + ["tuned"]
    rounds = data["settings"]["rounds"]
    return (_table(header, rows) + f"\n\nDecode tokens/s, median (min-max) over {rounds} rounds, each method in its "
            "own engine every round, in another order every round; acceptance length after the semicolon. "
            + _equality("hard-tune-vs-fixed") + " " + _source("hard-tune-vs-fixed") + "\n\n" + _paired(data))


# Two-sided 95% quantiles of Student's t by degrees of freedom (rounds - 1); past 30, the normal's.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
       10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110,
       18: 2.101, 19: 2.093, 20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060,
       26: 2.056, 27: 2.052, 28: 2.048, 29: 2.045, 30: 2.042}


def paired_ratio(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """a over b, paired by round: the geometric mean of the rounds' ratios and its 95% interval
    (Student's t on the log ratios). A round runs every method back to back, so the machine's
    speed that round (which moves every method's rate alike, by up to a fifth between rounds
    here) cancels in the ratio of two of its cells, where it widens each cell's range."""
    if len(a) < 2:
        raise ValueError(f"a paired interval needs two rounds at least, not {len(a)}: "
                         "run the bench with --rounds 2 or more")
    logs = [math.log(x / y) for x, y in zip(a, b, strict=True)]
    mean = statistics.fmean(logs)
    half = T95.get(len(logs) - 1, 1.96) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def _paired_cells(data: dict, n: int, b: int) -> dict[int, tuple[float, float, float]]:
    tuned = _cell(data, "tuned", n, b)["per_round"]["decode_tok_s"]
    return {k: paired_ratio(tuned, _cell(data, f"sparrow-{k}", n, b)["per_round"]["decode_tok_s"]) for k in DEPTHS}


def _paired(data: dict) -> str:
    """Tuned against each fixed depth round by round, and the verdict: slower than a fixed depth
    only where the whole 95% interval of the ratio lies below 1."""
    rows, behind, level = [], [], []
    for n in _lengths(data):
        for b in sorted({r["batch"] for r in data["records"]}):
            cells = _paired_cells(data, n, b)
            rows.append([_n(n), str(b)] + [f"{g:.2f}x ({lo:.2f}-{hi:.2f})" for g, lo, hi in cells.values()])
            behind += [f"depth {k} at batch {b}" for k, (g, lo, hi) in cells.items() if hi < 1]
            level += [f"depth {k} at batch {b} ({g:.2f}x)" for k, (g, lo, hi) in cells.items() if lo <= 1 <= hi]
    verdict = (f"Tune's choice is slower than {', '.join(behind)}: there the whole interval lies below 1." if behind
               else "Tune's choice is slower than no fixed depth at any batch size: no interval lies below 1"
               + (f"; these rounds do not separate it from {', '.join(level)}." if level else "."))
    return ("Tuned over each fixed depth, round by round: the geometric mean of the same round's ratio, "
            "its 95% interval in brackets (Student's t over the rounds' log ratios; a round's machine "
            "speed cancels in the ratio of two of its cells):\n\n"
            + _table(["visual tokens", "batch"] + [f"over depth {k}" for k in DEPTHS], rows) + "\n\n" + verdict)


def _rate_cell(r: dict) -> str:
    lo, hi = r["decode_tok_s_range"]
    return f"{r['decode_tok_s']:,.0f} ({lo:,.0f}-{hi:,.0f}; {r['acceptance_length']:.2f})"


def readme_trees() -> str:
    replay, search = load("tree-replay"), load("tree-search")
    gap = max(abs(r["tree"][str(n)] - r["chain"][str(n)]) / r["chain"][str(n)]
              for r in replay["records"] for n in (2, 4, 8))
    cells = [(r, _cell(search, "sparrow", r["visual_tokens"], r["batch"]))
             for r in search["records"] if r["method"] == "tree3"]
    cost = [t["draft_ms_per_step"] / c["draft_ms_per_step"] for t, c in cells]
    accept = max(abs(t["acceptance_length"] - c["acceptance_length"]) / c["acceptance_length"] for t, c in cells)
    lengths = ", ".join(_n(r["visual_tokens"]) for r in replay["records"])
    return (f"Tree verification would not pay on the easy world's draft: replayed on held-out clips, a tree of N "
            f"nodes accepts what a chain of N tokens does (within {100 * gap:.1f}% for N = 2, 4, 8 at {lengths} visual tokens), "
            f"and tree search in the serving drafter accepts what the chain does (within {100 * accept:.1f}%) at "
            f"{min(cost):.1f}-{max(cost):.1f}x its draft time, so vLLM's chain verification is kept and tree search "
            f"ships off {_files('tree-replay', 'tree-search')}.")


def quality() -> str:
    data = load("k3")
    rows = [[_n(n), f"{r['caption_word_accuracy']:.3f}", f"{r['object_precision']:.2f}", f"{r['object_recall']:.2f}",
             f"{r['caption_exact']:.2f}"] for n in _lengths(data) for r in [_cell(data, "none", n)]]
    header = ["visual tokens", "caption word accuracy", "objects named: precision", "recall", "exact captions"]
    return _table(header, rows) + "\n\n" + _source("k3")


def hard_quality() -> str:
    """The hard world's target captions, scored by meaning (hard_caption.facts): many are right."""
    data = load("hard-k5")
    rows = [[_n(n), f"{r['caption_fact_accuracy']:.3f}", f"{r['object_precision']:.2f}", f"{r['object_recall']:.2f}",
             f"{sum(map(len, r['output_token_ids'])) / len(r['output_token_ids']):.0f}"]
            for n in _lengths(data) for r in [_cell(data, "none", n)]]
    header = ["visual tokens", "caption fact accuracy", "objects named: precision", "recall", "caption tokens"]
    return _table(header, rows) + "\n\n" + _source("hard-k5")


def hard_k5() -> str:
    """Every method of the hard-world run with its per-position acceptance, batch 1."""
    data = load("hard-k5")
    methods = [m for m in dict.fromkeys(r["method"] for r in data["records"]) if m != "none"]
    rows = [[_n(n), m, f"{r['acceptance_length']:.2f}", "/".join(f"{p:.2f}" for p in r["per_position"]),
             f"{r['draft_ms_per_step']:.2f}", f"{speedup(data, r):.2f}x"]
            for n in _lengths(data) for m in methods for r in [_cell(data, m, n)]]
    header = ["visual tokens", "method", "acceptance length", "per position", "draft ms / step", "decode speedup"]
    return _table(header, rows) + "\n\n" + _equality("hard-k5") + " " + _source("hard-k5")


ABLATIONS = {"no-mtp": "MTP off", "no-ivsb": "IVSB off", "no-window": "text window off (every text token)",
             "ivsb-all": "IVSB on every sample (paper)"}


def ablations(name: str = "k3") -> str:
    """Acceptance length of every ablation beside the shipped draft, per length."""
    data = load(name)
    lengths = _lengths(data)
    rows = [["Sparrow (shipped)"] + [f"{_cell(data, 'sparrow', n)['acceptance_length']:.2f}" for n in lengths]]
    rows += [[label] + [f"{_cell(data, m, n)['acceptance_length']:.2f}" for n in lengths]
             for m, label in ABLATIONS.items()]
    return _table(["draft"] + [_n(n) for n in lengths], rows) + "\n\n" + _equality(name) + " " + _source(name)


def ivsb_replay() -> str:
    build = json.loads((ROOT / "models" / "world" / "build.json").read_text())
    names = {"sparrow": "Sparrow (IVSB on half of the samples)", "ablation no-ivsb": "IVSB off",
             "ablation ivsb-all": "IVSB on every sample", "eagle": "EAGLE-1-style", "eagle3": "EAGLE-3"}
    rows = [[label, f"{build[key + '_heldout_replay']['mean_acceptance_length']:.2f}"] for key, label in names.items()]
    return _table(["draft", "held-out replayed acceptance length, K = 3"], rows) + "\n\n" + \
        "From `models/world/build.json`, written by `sparrow demo build --models models/world`."


def batch(name: str = "batch") -> str:
    """Decode speedup (draft ms per step) of every method per length and batch size."""
    data = load(name)
    rows = []
    for n in _lengths(data):
        for b in sorted({r["batch"] for r in data["records"]}):
            cells = [_cell(data, m, n, b) for m in ("sparrow", "eagle", "eagle3")]
            rows.append([_n(n), str(b)] + [f"{speedup(data, r):.2f} ({r['draft_ms_per_step']:.2f})" for r in cells])
    return _table(["visual tokens", "batch", "Sparrow", "EAGLE-1-style", "EAGLE-3"], rows) + "\n\n" + \
        _equality(name) + " " + _source(name)


def depth() -> str:
    rows = []
    for name in ("depth-b1", "depth-b16"):
        data = load(name)
        for n in _lengths(data):
            b = data["records"][0]["batch"]
            cells = [_cell(data, m, n, b) for m in ("k3", "k8", "adaptive")]
            rows.append([_n(n), str(b)] + [f"{speedup(data, r):.2f}x ({r['acceptance_length']:.2f})" for r in cells])
    return _table(["visual tokens", "batch", "K = 3", "K = 8", "adaptive, K = 8"], rows) + "\n\n" + \
        _equality("depth-b1", "depth-b16") + " " + _source("depth-b1", "depth-b16")


def hard_tune() -> str:
    """What `sparrow tune` chose for the hard draft on this machine: the cost of a drafted token
    (its draft and verify shares) per batch size, the depth each batch size gets, the tree
    verdict at those costs, what it would choose on the reference GPU's costs, and the stop
    threshold's expected tokens per unit of batch-1 step cost."""
    data = load("hard-tune")
    schedule = data["schedule"]
    depth_at = {b: d for lo, hi, d in schedule for b in range(lo, hi + 1)}
    verdicts = data["trees"].get("verdicts", {})
    rows = [[str(c["batch"]), f"{c['fixed_ms']:.2f}", f"{c['per_token_ms']:.2f}",
             f"{c['draft_token_cost']:.3f} + {c['verify_token_cost']:.3f}",
             f"{c['line_miss']:.1%}",
             str(depth_at.get(c["batch"], schedule[-1][2])), verdicts.get(str(c["batch"]), {}).get("best", "-")]
            for c in data["costs"]]
    costs = _table(["batch", "ms per step", "ms per drafted token", "a drafted token, in steps (draft + verify)",
                    "the cost line's worst miss", "depth chosen", "best plan, trees allowed"], rows)
    scores = data["stop_scores"]
    stops = _table(["stop threshold"] + list(scores), [["tokens per unit cost"] + [f"{v:.2f}" for v in scores.values()]])
    drafts, tokens, ref = data["replay"]["drafts"], data["tokens_per_step"], data["reference"]
    return (costs + "\n\n" + stops + f"\n\nHeld-out replay: {drafts} verify steps, tokens per step at depth "
            f"1..{len(tokens)}: " + ", ".join(f"{t:.2f}" for t in tokens) + f". Chosen: "
            f"`num_speculative_tokens_per_batch_size` {json.dumps(schedule)}, `stop_confidence` "
            f"{data['stop_confidence']}. On the {ref['name']} the same replay would choose "
            f"{json.dumps(ref['schedule'])}" + (f" (best plan per batch size, trees allowed: "
                                                 + ", ".join(f"{b}: {p}" for b, p in ref["trees"].items()) + ")"
                                                 if ref.get("trees") else "") + ". " + _source("hard-tune"))


def k8_all() -> str:
    data = load("k8-all")
    lengths = _lengths(data)
    rows = [[LABEL[m]] + [f"{speedup(data, _cell(data, m, n)):.2f}x ({_cell(data, m, n)['acceptance_length']:.2f})"
                          for n in lengths] for m in ("sparrow", "eagle", "eagle3")]
    last = [f"{LABEL[m]} {_cell(data, m, lengths[1])['per_position'][-1]:.2f}" for m in ("sparrow", "eagle", "eagle3")]
    return (_table(["method at K = 8"] + [_n(n) for n in lengths], rows) + "\n\n"
            + f"Share of 8th draft tokens accepted at {_n(lengths[1])} visual tokens: {', '.join(last)}. "
            + _equality("k8-all") + " " + _source("k8-all"))


def adaptive() -> str:
    data = load("depth-b1")
    n = _lengths(data)[0]
    k8, ad = _cell(data, "k8", n), _cell(data, "adaptive", n)
    return (f"On the easy demo world at {_n(n)} visual tokens, with K = 8, `stop_confidence` 0.7 verified "
            f"{ad['draft_tokens'] / ad['drafts']:.1f} draft tokens per step instead of "
            f"{k8['draft_tokens'] / k8['drafts']:.1f}, {100 * ad['accepted'] / ad['draft_tokens']:.0f}% of them accepted "
            f"instead of {100 * k8['accepted'] / k8['draft_tokens']:.0f}% (decode speedup {speedup(data, ad):.2f}x "
            f"instead of {speedup(data, k8):.2f}x). {_source('depth-b1')}")


def tree_replay(name: str = "tree-replay") -> str:
    data = load(name)
    nodes = sorted(int(k) for k in data["records"][0]["tree"])
    sure = all("target_top1" in r for r in data["records"])  # runs before it was recorded lack it
    rows = [[_n(r["visual_tokens"]), str(r["verify_points"])] + [f"{r['chain'][str(d)]:.2f}" for d in (2, 4, 8)]
            + [f"{r['search']['4']:.2f}"] + [f"{r['tree'][str(k)]:.2f}" for k in nodes]
            + ([f"{r['target_top1']:.3f}"] if sure else []) for r in data["records"]]
    header = (["visual tokens", "verify points"] + [f"chain {d}" for d in (2, 4, 8)] + ["search 4"]
              + [f"tree {k}" for k in nodes] + (["target top-1"] if sure else []))
    return _table(header, rows) + "\n\n" + _source(name)


def hard_build() -> str:
    """The hard world's build time on this machine, stage by stage, from its build record."""
    path = ROOT / "models" / "world-hard" / "build.json"
    seconds = json.loads(path.read_text())["seconds"]

    def span(s: float) -> str:
        return f"{s / 3600:.1f} h" if s >= 5400 else f"{s / 60:.0f} min" if s >= 120 else f"{s:.0f} s"

    rows = [[stage, span(s)] for stage, s in seconds.items()]
    rows.append(["all stages", span(sum(seconds.values()))])
    return _table(["stage", "time"], rows) + f"\n\nFrom `{path.relative_to(ROOT)}` (\"seconds\")."


def hard_tree_replay() -> str:
    """The hard world's chains and trees at equal verified tokens, greedy and sampled, with each
    tree's break-even verify cost at a few draft costs (benchmarks/tree_replay.py)."""
    data = load("hard-tree-replay")
    recs, settings = data["records"], data["settings"]
    chains, trees = [int(x) for x in settings["chains"].split(",")], [int(x) for x in settings["trees"].split(",")]

    def taus(kind: str) -> list[list[str]]:
        return [[_n(r["visual_tokens"]), str(r["verify_points"])]
                + [f"{(r if kind == 'greedy' else r['sampled'])['chain'][str(d)]:.2f}" for d in chains]
                + [f"{(r if kind == 'greedy' else r['sampled'])['tree'][str(n)]:.2f}" for n in trees]
                + [f"{r['target_top1']:.3f}"] for r in recs]

    header = (["visual tokens", "verify points"] + [f"chain {d}" for d in chains] + [f"tree {n}" for n in trees]
              + ["target top-1"])
    costs = list(recs[0]["break_even_v"])
    even = [[_n(r["visual_tokens"]), d] + [("never" if v is None else f"{v:.3f}")
                                           for v in (r["break_even_v"][d][str(n)] for n in trees)]
            for r in recs for d in costs]
    return (f"Greedy (trees from a {settings['search_depth']}-level search, top-{settings['topk']}):\n\n"
            + _table(header, taus("greedy"))
            + f"\n\nSampled at T = {settings['temperature']} (sample-and-match along the captured answer; lower "
              "bounds, for chains and trees alike):\n\n" + _table(header, taus("sampled"))
            + "\n\nBreak-even v: the cost of one more verified token (relative to a one-token step) below which "
              f"each tree beats every chain of depth 1-{max(chains)}, at draft forward cost d:\n\n"
            + _table(["visual tokens", "d"] + [f"tree {n}" for n in trees], even) + "\n\n" + _source("hard-tree-replay"))


TREE_PAYS = 0.05  # the gain over the best chain a tree must show before tree verification is worth building:
# the rule prices verified tokens and draft forwards only, not tree attention's mask or its scattered KV writes


def _tree_gains(recs: list[dict], depth: int, d: float, v: float, sampled: bool) -> tuple[str, list[float]]:
    """The best plan's name (one per length, joined when they agree) and, per length, the best
    tree's tokens per unit of step cost over the best chain's, at (d, v)."""
    from vllm_sparrow.training.depth import tree_verdict

    best, gains = [], []
    for r in recs:
        taus = r["sampled"] if sampled else r
        verdict = tree_verdict({int(k): t for k, t in taus["chain"].items()},
                               {int(n): (t, depth) for n, t in taus["tree"].items()}, d, v)
        best.append(verdict.best)
        gains.append(max(verdict.tree_speed.values()) / verdict.chain_speed - 1)
    return (best[0] if len(set(best)) == 1 else ", ".join(best)), gains


def hard_trees() -> str:
    """The tree question at equal verified tokens, answered on the reference GPU's costs
    (vllm_sparrow/training/gpu_costs.py) with the rule of depth.tree_verdict, greedy and sampled,
    whichever way it goes."""
    from vllm_sparrow.training import gpu_costs

    data = load("hard-tree-replay")
    recs, depth = data["records"], data["settings"]["search_depth"]
    parts, pays = [], []
    for sampled in (False, True):
        for b, (d, v) in gpu_costs.COSTS.items():
            best, gains = _tree_gains(recs, depth, d, v, sampled)
            if min(gains) >= TREE_PAYS:
                pays.append(f"{'sampled' if sampled else 'greedy'} at batch {b}")
            parts.append(f"{'sampled' if sampled else 'greedy'}, batch {b} (d {d:.3f}, v {v:.3f}): {best}, the best "
                         f"tree {100 * min(gains):+.0f}% to {100 * max(gains):+.0f}% against the best chain")
    lengths = ", ".join(_n(r["visual_tokens"]) for r in recs)
    verdict = (f"a tree gains {100 * TREE_PAYS:.0f}% or more at every length only {' and '.join(pays)}: tree "
               "verification would pay there and is worth building on vLLM 0.34's runner (a later issue); elsewhere "
               "chains are kept" if pays else
               f"no tree gains {100 * TREE_PAYS:.0f}% over the best chain at every length: chains are kept")
    return (f"On the hard world's draft at {lengths} visual tokens, the plan with the most tokens per unit of step "
            f"cost, tau / (1 + N v + D d) (trees from a {depth}-level search), on the {gpu_costs.NAME}: "
            + "; ".join(parts) + f". So {verdict} {_files('hard-tree-replay')}.")


def tree_search() -> str:
    data = load("tree-search")
    rows = []
    for n in _lengths(data):
        for b in sorted({r["batch"] for r in data["records"]}):
            cells = [_cell(data, m, n, b) for m in ("sparrow", "tree3")]
            rows.append([_n(n), str(b)] + [f"{r['acceptance_length']:.2f} / {r['draft_ms_per_step']:.2f} / "
                                           f"{speedup(data, r):.2f}x" for r in cells])
    header = ["visual tokens", "batch", "chain: accept / draft ms / speedup", "tree search (top-3): same"]
    return _table(header, rows) + "\n\n" + _equality("tree-search") + " " + _source("tree-search")


def op_count() -> str:
    data = load("op-count")
    rows = [[r["method"], str(r["batch"]), str(r["decode_steps"]), f"{r['ops_per_step']:.0f}",
             f"{r['host_reads_per_step']:.1f}"] for r in data["records"]]
    return _table(["method", "batch", "decode steps", "aten ops per step", "host reads per step"], rows) + \
        "\n\n" + _source("op-count")


def mixed_step() -> str:
    """benchmarks/mixed_step.py: the draft time of the step where a text prompt joins decoding video
    requests, per arriving prompt length and method (median and range over the rounds)."""
    data = load("mixed-step")
    s = data["settings"]
    methods = [m for m in s["methods"] if m != "none"]
    cell = {(r["method"], r["prompt_tokens"]): r for r in data["summary"]}

    def ms(v: dict) -> str:
        return f"{v['median']:.1f} ({min(v['values']):.1f}-{max(v['values']):.1f})"

    rows = [[_n(n)] + [ms(cell[m, n]["join_draft_ms"]) for m in methods]
            + [ms(cell[m, n]["join_step_ms"]) for m in methods] for n in s["prompt_tokens"]]
    header = (["prompt tokens joining"] + [f"{LABEL[m]}: draft ms" for m in methods]
              + [f"{LABEL[m]}: step ms" for m in methods])
    n0 = s["prompt_tokens"][0]
    reference = ", ".join(f"{LABEL[m]} {ms(cell[m, n0]['decode_only_draft_ms'])}" for m in methods)
    return (_table(header, rows) + "\n\n" + f"{s['decodes']} video requests ({_n(s['visual_tokens'])} visual tokens) "
            f"decoding when the prompt arrives, K = {s['k']}, median (range) of {s['rounds']} rounds; draft ms of a "
            f"decode-only step of the same requests: {reference}. " + _source("mixed-step"))


def capture_speed() -> str:
    """benchmarks/capture_speed.py: samples/s of the transformers and the engine capture on the same samples."""
    from benchmarks.capture_speed import table

    data = load("capture-speed")
    s = data["settings"]
    return (table(data) + f"\n{s['prompts']} prompts for each bundled clip, {s['frames']} frames, answers of up to "
            f"{s['max_new_tokens']} tokens written by each path, float32; samples/s of the sample loop (start-up "
            "apart). " + _source("capture-speed"))


def ivsb_keep(name: str = "ivsb-keep") -> str:
    """benchmarks/ivsb_keep.py: held-out acceptance of drafts trained from captures keeping a share of
    IVSB states, on the world the run names (ivsb-keep: easy; hard-ivsb-keep: hard)."""
    from benchmarks.ivsb_keep import table

    data = load(name)
    s = data["settings"]
    build = "hard demo build" if s.get("world") == "hard" else "demo build"  # runs before --world were easy
    clips = ", ".join(f"{n} clips of {sec} s" for sec, n in s["recipe"]["clips"].items())
    return (table(data) + f"\nThe {build}'s draft data ({clips}; the last {s['recipe']['train']['holdout']} held out), "
            f"engine capture, bf16 states; the demo Sparrow recipe ({s['recipe']['train']['steps']} steps), replay at "
            f"K = {s['k']}. " + _source(name))


def hard_mtp_depth() -> str:
    """benchmarks/mtp_depth.py: the hard draft retrained with more MTP stages, replayed at depth 16."""
    from benchmarks.mtp_depth import table

    data = load("hard-mtp-depth")
    s = data["settings"]
    return (table(data) + f"\nThe hard build's draft clips (the last {s['recipe']['train']['holdout']} held out), "
            f"engine capture; the demo Sparrow recipe ({s['recipe']['train']['steps']} steps) but for its MTP "
            f"stages; held-out replay at depth {s['k']}, mean over seeds {', '.join(map(str, s['seeds']))}. "
            + _source("hard-mtp-depth"))


def draft_step_cache() -> str:
    """benchmarks/draft_step_cache.py: the draft step alone and after the target's KV bytes stream through memory."""
    from benchmarks.draft_step_cache import table

    data = load("draft-step-cache")
    s = data["settings"]
    return (table(data) + f"\nThe hard demo draft, K = {s['k']}, batch 1, torch attention, float32; medians of "
            f"{s['steps']} steps, {s['repeats']} repeats per length. " + _source("draft-step-cache"))


def server_soak(name: str = "server-soak") -> str:
    """benchmarks/server_soak.py: the server tree's resident memory over phases of mixed traffic."""
    from benchmarks.server_soak import table

    data = load(name)
    s, first = data["settings"], data["records"][0]
    same = all(r.get(f"equal_to_{first['method']}", True) for r in data["records"])
    return (table(data["records"]) + f"\n`vllm serve` of the hard world's target, `--max-num-seqs {s['max_num_seqs']} "
            f"--max-model-len {s['max_model_len']}`, {s['warmup']} warm-up rounds, then {s['phases']} phases of "
            f"{s['rounds']} rounds ({first['phases'][0]['requests']} requests a phase, 16 in flight). Every greedy "
            f"answer was the same in every round{' and equal to no speculation' + chr(39) + 's' if same else ''}; "
            f"every bad request got a 4xx. " + _source(name))


VIEWS = {"readme-k3": readme_k3, "readme-depth": readme_depth, "readme-cache": readme_cache,
         "readme-hard": readme_hard, "readme-hard-cache": readme_hard_cache, "hard-quality": hard_quality,
         "hard-k5": hard_k5, "hard-tree-replay": hard_tree_replay, "hard-trees": hard_trees, "hard-build": hard_build,
         "hard-scenes": hard_scenes,
         "hard-depth": hard_depth_table, "hard-tune-vs-fixed": hard_tune_vs_fixed, "hard-flatness": hard_flatness, "hard-tune": hard_tune,
         "hard-ablations": lambda: ablations("hard-ablations"), "hard-batch": lambda: batch("hard-batch"),
         "readme-trees": readme_trees, "quality": quality, "ablations": ablations, "ivsb-replay": ivsb_replay,
         "batch": batch,
         "depth": depth, "k8-all": k8_all, "adaptive": adaptive, "tree-replay": tree_replay,
         "tree-search": tree_search, "op-count": op_count, "mixed-step": mixed_step, "capture-speed": capture_speed,
         "ivsb-keep": ivsb_keep, "hard-ivsb-keep": lambda: ivsb_keep("hard-ivsb-keep"), "hard-mtp-depth": hard_mtp_depth, "draft-step-cache": draft_step_cache, "server-soak": server_soak,
         "server-soak-long": lambda: server_soak("server-soak-long")}


def whole_file(name: str) -> str:
    """benchmarks/results/NAME.md: the run's full table."""
    if name in ("tree-replay", "hard-tree-replay", "hard-tune", "op-count", "mixed-step", "capture-speed", "ivsb-keep", "hard-ivsb-keep",
                "hard-mtp-depth",
                "draft-step-cache", "server-soak", "server-soak-long"):
        return f"# {name}\n\n" + VIEWS[name]() + "\n"
    from sparrow_world.bench.report import table

    data = load(name)
    return f"# {name}\n\n{_source(name)}\n\n" + table(data["records"])


# A block: its opening line, what the view made (empty before the first render), its closing line.
BLOCK = re.compile(r"(<!-- published: ([a-z0-9-]+) -->\n)((?:(?!<!-- published:).)*?)(<!-- /published -->)", re.S)


def fill_blocks(text: str, views=None) -> str:
    """text with every published block's content made anew by its view."""
    views = VIEWS if views is None else views
    return BLOCK.sub(lambda m: m.group(1) + views[m.group(2)]() + "\n" + m.group(4), text)


def rendered_files() -> dict[Path, str]:
    """Every file that holds published numbers, as the JSONs make it."""
    files = {RESULTS / f"{name}.md": whole_file(name) for name in RUNS if (RESULTS / f"{name}.json").exists()}
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        files[path] = fill_blocks(path.read_text())
    return files


def render() -> None:
    from vllm_sparrow.durable import atomic_write_text

    for path, text in rendered_files().items():
        if not path.exists() or path.read_text() != text:
            atomic_write_text(path, text)
            print(f"wrote {path.relative_to(ROOT)}")
    if (RESULTS / "k3.json").exists():
        from sparrow_world.bench.report import plot

        data = load("k3")
        plot(data["records"], RESULTS / "k3.png", data["environment"]["gpu"] or
             f"CPU only ({data['environment']['cpu_count']} cores, {data['environment']['cpu']})")


def check() -> list[str]:
    """Files whose published numbers differ from what their JSONs make."""
    return [str(p.relative_to(ROOT)) for p, text in rendered_files().items() if not p.exists() or p.read_text() != text]


STAMP = "publish-run.json"  # in a run's --out folder (beside a JSON --out): its command, and whether it finished


def run(name: str, resume: bool = False) -> None:
    """Run NAME's command and keep its JSON. A published table is one run: the command's --out is
    emptied first, so a bench never resumes from records an earlier run left there, unless
    `resume` is asked and that folder holds this same command's run, started by publish and not
    finished (a run killed partway: resuming it keeps it one run of one command)."""
    command, minutes = RUNS[name]
    argv = shlex.split(command)
    argv = ([sys.executable, "-m", "vllm_sparrow.cli"] + argv[1:] if argv[0] == "sparrow"
            else [sys.executable] + argv[1:])
    out = ROOT / argv[argv.index("--out") + 1]  # a bench's folder, or a JSON file (sparrow tune --out)
    stamp = out.with_name(out.name + "." + STAMP) if out.suffix == ".json" else out / STAMP
    _start_clean(name, command, stamp, out, resume)
    print(f"[publish] {name}: {command} (about {minutes} min here)", flush=True)
    env = runtime_env()
    subprocess.run(argv, cwd=ROOT, check=True, env=env)
    _stamp(stamp, command, finished=True)
    data = json.loads((out if out.suffix == ".json" else out / "results.json").read_text())
    if "environment" not in data:  # the product's commands don't record the machine; the demo kit does
        from sparrow_world.bench.run import environment

        data["environment"] = environment()
    from vllm_sparrow.durable import atomic_write_text

    RESULTS.mkdir(parents=True, exist_ok=True)
    data["environment"]["ld_preload"] = env.get("LD_PRELOAD", "")
    atomic_write_text(RESULTS / f"{name}.json", json.dumps({"command": command, **data}) + "\n")


def runtime_env() -> dict[str, str]:
    """The environment a run's command gets: this one, with Intel OpenMP preloaded as vLLM's CPU
    backend asks and as `make test` / `make demo` run (the Makefile's RUN_ENV). Without it vLLM
    warns that speculative decoding on CPU loses much of its speed, which would measure every
    method below its best; the JSON records what was preloaded."""
    env = dict(os.environ)
    iomp = Path(sys.prefix) / "lib" / "libiomp5.so"  # shipped in the venv by intel-openmp on CPU
    preloaded = [p for p in env.get("LD_PRELOAD", "").split(":") if p]
    if iomp.is_file() and str(iomp) not in preloaded:
        env["LD_PRELOAD"] = ":".join([str(iomp), *preloaded])
    return env


def _start_clean(name: str, command: str, stamp: Path, out: Path, resume: bool) -> None:
    """Empty the run's output (or keep it to resume this same command's unfinished run)."""
    import shutil

    earlier = json.loads(stamp.read_text()) if stamp.is_file() else None
    if resume:
        if earlier is None or earlier["command"] != command or earlier["finished"]:
            raise SystemExit(f"{name}: nothing to resume at {out} (no unfinished run of this command there); "
                             "run it without --resume to start clean")
        print(f"[publish] {name}: resuming the unfinished run at {out}", flush=True)
        return
    if out.suffix == ".json":
        out.unlink(missing_ok=True)
    elif out.exists():
        print(f"[publish] {name}: removing {out} (an earlier run's records)", flush=True)
        shutil.rmtree(out)
    _stamp(stamp, command, finished=False)


def _stamp(stamp: Path, command: str, finished: bool) -> None:
    from vllm_sparrow.durable import atomic_write_json

    stamp.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(stamp, {"command": command, "finished": finished})


def main(argv: list[str]) -> int:
    if argv[:1] == ["run"]:
        names = [a for a in argv[1:] if a != "--resume"]
        for name in names:
            run(name, resume="--resume" in argv)
        render()
        return 0
    if argv == ["render"]:
        render()
        return 0
    if argv == ["check"]:
        stale = check()
        print("\n".join(f"differs from its JSON: {p}" for p in stale) or "every published table matches its JSON")
        return 1 if stale else 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
