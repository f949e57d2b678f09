"""results.json, table.md and plot.png from the benchmark's records."""

from __future__ import annotations

from pathlib import Path

from vllm_sparrow.durable import atomic_save, atomic_write_json, atomic_write_text
from .config import BenchConfig

COLUMNS = ("method", "visual tokens", "batch", "accept len", "accept (no bonus)", "per position", "draft ms/step",
           "draft cache KiB", "decode tok/s", "decode speedup", "outside forward", "limit speedup", "e2e speedup",
           "= no spec", "caption words", "objects P/R")


def _fmt(v, spec=".2f"):
    return "-" if v is None else format(v, spec)


def _spread(r: dict, key: str, spec: str = ".2f") -> str:
    """A timed value as median (min-max) over the rounds; a record of one round (or older than
    rounds) shows the value alone."""
    lo_hi = r.get(key + "_range")
    if r.get(key) is None or not lo_hi or r.get("rounds", 1) < 2:
        return _fmt(r.get(key), spec)
    return f"{r[key]:{spec}} ({lo_hi[0]:{spec}}-{lo_hi[1]:{spec}})"


LIMIT = ("outside forward", "limit speedup")  # columns of runs that timed the target's forwards


def table(records: list[dict]) -> str:
    # the hard world scores captions by meaning (fact accuracy), the easy one word by word
    facts = any(r.get("caption_fact_accuracy") is not None for r in records)
    caption_key = "caption_fact_accuracy" if facts else "caption_word_accuracy"
    limits = any("outside_forward_share" in r for r in records)  # runs before they were timed lack them
    columns = [("caption facts" if facts and c == "caption words" else c) for c in COLUMNS
               if limits or c not in LIMIT]
    rows = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in records:
        per_pos = "/".join(f"{p:.2f}" for p in r["per_position"]) if r.get("per_position") else "-"
        equal = r.get("outputs_equal_no_spec")
        rows.append("| " + " | ".join([
            r["method"], str(r["visual_tokens"]), str(r.get("batch", 1)), _fmt(r.get("acceptance_length")),
            _fmt(r.get("acceptance_length_no_bonus")), per_pos, _spread(r, "draft_ms_per_step"),
            _fmt(r["draft_cache_bytes"] / 1024, ".1f"), _spread(r, "decode_tok_s", ".1f"),
            _spread(r, "decode_speedup"),
            *([_spread(r, "outside_forward_share"), _spread(r, "limit_speedup")] if limits else []),
            _spread(r, "e2e_speedup"),
            "-" if equal is None else ("yes" if equal else "NO"), _fmt(r.get(caption_key), ".3f"),
            f"{r['object_precision']:.2f}/{r['object_recall']:.2f}",
        ]) + " |")
    return "\n".join(rows) + "\n"


def write_reports(out: Path, records: list[dict], cfg: BenchConfig, env: dict) -> None:
    atomic_write_json(out / "results.json", {"environment": env, "settings": cfg.settings(), "records": records},
                      indent=None)
    where = env["gpu"] or f"CPU only ({env['cpu_count']} cores, {env['cpu']})"
    batched = [b for b in cfg.batch_sizes if b > 1]
    together = (f"; batch sizes {', '.join(map(str, batched))}: that many clips submitted together "
                "(aggregate decode tok/s)") if batched else ""
    head = (f"Measured {env['date']} on {where}; vLLM {env['vllm']}, torch {env['torch']}; "
            f"K={cfg.num_speculative_tokens}, greedy, {cfg.max_tokens} new tokens at most; batch size 1: "
            f"{cfg.clips_per_length} clip(s) per length one after another{together}. Timed columns: median "
            f"(min-max) over {cfg.rounds} rounds, each method in its own engine, in another order every round; "
            "speedups against the same round's no-speculation engine. Outside forward: the share of the decode "
            "phase spent outside the target's own forwards (drafting, sampling, verification and the runner's "
            "bookkeeping); limit speedup: the decode speedup were that share 0 in both engines.\n\n")
    atomic_write_text(out / "table.md", head + table(records))
    plot(records, out / "plot.png", where)
    print(f"[bench] wrote {out / 'results.json'}, {out / 'table.md'}, {out / 'plot.png'}", flush=True)


def plot(records: list[dict], path: Path, where: str) -> None:
    """Acceptance and speedup against visual tokens (batch 1) and, with several batch sizes,
    speedup against batch size. Ticks at the measured values (1,536, not 6x10^2; batch 16, not
    2^4), acceptance from 1 and speedup from 0, one colour per method in every panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullLocator

    sizes = sorted({r.get("batch", 1) for r in records})
    lengths = sorted({r["visual_tokens"] for r in records})
    fig, axes = plt.subplots(1, 3 if len(sizes) > 1 else 2, figsize=(16 if len(sizes) > 1 else 11, 4))
    a, s = axes[0], axes[1]
    methods = [m for m in dict.fromkeys(r["method"] for r in records) if m != "none"]
    colour = {m: f"C{i % 10}" for i, m in enumerate(methods)}

    def ticks(ax, values, label):
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(FixedLocator(values))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticks(values, [f"{v:,}" for v in values], rotation=30, ha="right")  # 17,408 and 24,960 sit close
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)

    for m in methods:
        rows = sorted((r for r in records if r["method"] == m and r.get("batch", 1) == 1), key=lambda r: r["visual_tokens"])
        xs = [r["visual_tokens"] for r in rows]
        a.plot(xs, [r.get("acceptance_length") or float("nan") for r in rows], marker="o", color=colour[m], label=m)
        _with_range(s, rows, xs, "decode_speedup", color=colour[m], label=m)
    for ax, title in ((a, "mean acceptance length (incl. bonus), batch 1"),
                      (s, "decode speedup vs no speculation, batch 1 (bars: range over rounds)")):
        ticks(ax, lengths, "visual tokens")
        ax.set_title(title)
        ax.legend(fontsize=7)
    a.set_ylim(bottom=1.0)  # one token per step is what no speculation gives
    s.set_ylim(bottom=0.0)
    s.axhline(1.0, color="grey", lw=0.8)
    if len(sizes) > 1:  # speedup against batch size: colour = method, line style = length
        ax = axes[2]
        styles = ["-", "--", ":", "-."]
        for m in methods:
            for i, n in enumerate(lengths):
                rows = sorted((r for r in records if r["method"] == m and r["visual_tokens"] == n),
                              key=lambda r: r.get("batch", 1))
                _with_range(ax, rows, [r.get("batch", 1) for r in rows], "decode_speedup", color=colour[m],
                            ls=styles[i % len(styles)], label=f"{m} @ {n:,}")
        ticks(ax, sizes, "batch size (requests together)")
        ax.set_title("decode speedup vs no speculation")
        ax.set_ylim(bottom=0.0)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.legend(fontsize=7)
    fig.suptitle(f"vllm-sparrow long-video benchmark ({where})", fontsize=9)
    fig.tight_layout()
    atomic_save(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)


def _with_range(ax, rows: list[dict], xs: list, key: str, **style) -> None:
    """The median over rounds as a line, the rounds' range as error bars (none for one round)."""
    ys = [r.get(key) or float("nan") for r in rows]
    ranges = [r.get(key + "_range") or [y, y] for r, y in zip(rows, ys)]
    err = [[y - lo for y, (lo, _) in zip(ys, ranges)], [hi - y for y, (_, hi) in zip(ys, ranges)]]
    ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, **style)
