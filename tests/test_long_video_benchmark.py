"""`sparrow bench --quick` (the CI smoke size of the long-video benchmark) measures every method
on the demo models through vLLM, at batch size 1 and with clips submitted together, and writes
the JSON records, the markdown table and the plot."""

import json
import subprocess
import sys
from pathlib import Path

METHODS = ("none", "sparrow", "eagle", "eagle3", "ngram", "untrained")


def test_quick_benchmark_measures_every_method_at_every_length(quick_bench):
    cfg, records = quick_bench
    assert set(records) == {(m, n, b) for m in METHODS for n in cfg.lengths for b in cfg.batch_sizes}
    assert max(cfg.batch_sizes) > 1
    for (method, n, b), r in records.items():
        assert r["decode_tok_s"] > 0 and r["e2e_s"] > 0
        assert len(r["prompt_tokens"]) == (cfg.clips_per_length if b == 1 else b)
        assert len(set(map(tuple, r["output_token_ids"]))) == len(r["output_token_ids"]), "different clips"
        # the prompt holds the clip's visual tokens: the length axis is real
        assert n <= r["prompt_tokens"][0] <= n + 64, (method, n, r["prompt_tokens"])
        if method != "none":
            assert r["drafts"] > 0 and r["draft_ms_per_step"] > 0
            assert len(r["per_position"]) == cfg.num_speculative_tokens
        if method not in ("none", "ngram"):  # (ngram drafts only where the text repeats)
            # the counters match the outputs: a verify step yields its accepted drafts + 1 token,
            # the prefill one more per request, and a request's last step may overshoot max
            # tokens or end at EOS (dropping up to K) or go undrafted (one token)
            produced, reqs = sum(len(ids) for ids in r["output_token_ids"]), len(r["output_token_ids"])
            upper = reqs + r["drafts"] + r["accepted"]
            assert upper - reqs * cfg.num_speculative_tokens <= produced <= upper + reqs, (method, n, b, produced, upper)


def test_every_method_reproduces_the_no_speculation_captions(quick_bench):
    _, records = quick_bench
    assert all(r["outputs_equal_no_spec"] for r in records.values()), \
        [(k, r["outputs_equal_no_spec"]) for k, r in records.items()]


def test_draft_cache_holds_text_only_for_sparrow_and_every_token_for_eagle(quick_bench):
    cfg, records = quick_bench
    short, long = cfg.lengths[0], cfg.lengths[-1]
    draft = json.loads((Path(cfg.sparrow) / "config.json").read_text())
    layer = draft["transformer_layer_config"]
    rows = draft["anchor_tokens"] + draft["window_tokens"] + cfg.num_speculative_tokens  # A + W + K
    ring_bytes = 2 * layer["num_key_value_heads"] * rows * layer["head_dim"] * 4  # K and V, float32
    for n in (short, long):  # one fixed ring per request, whatever the video length
        assert records[("sparrow", n, 1)]["draft_cache_bytes"] == ring_bytes
    eg_short, eg_long = records[("eagle", short, 1)], records[("eagle", long, 1)]
    assert eg_long["draft_cache_bytes"] > 2 * eg_short["draft_cache_bytes"]  # grows with the video


def test_results_json_table_and_plot_are_written(quick_bench):
    cfg, records = quick_bench
    out = Path(cfg.out)
    results = json.loads((out / "results.json").read_text())
    assert len(results["records"]) == len(records)
    assert results["environment"]["vllm"].startswith("0.32.0")
    assert results["settings"]["lengths"] == list(cfg.lengths)
    table = (out / "table.md").read_text()
    assert "CPU only" in table or "GPU" in table
    assert sum(line.startswith("| sparrow |") for line in table.splitlines()) == len(cfg.lengths) * len(cfg.batch_sizes)
    assert (out / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_rerun_with_the_same_settings_reuses_finished_records(quick_bench):
    cfg, records = quick_bench
    # a finished run: the CLI only rewrites the reports (no engine is started)
    done = subprocess.run([sys.executable, "-m", "vllm_sparrow.cli", "bench", "--quick", "--out", cfg.out,
                           "--target", cfg.target, "--sparrow", cfg.sparrow, "--eagle", cfg.eagle, "--eagle3", cfg.eagle3,
                           "--ablation", f"untrained={cfg.ablations['untrained']}"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "engine up" not in done.stdout and "| sparrow |" in done.stdout


def test_an_ablation_can_carry_its_own_depth():
    """--ablation NAME=DIR@K compares depths in one run; a plain DIR runs at the run's K."""
    from sparrow_world.bench.config import BenchConfig
    from sparrow_world.bench.engines import speculative_config

    cfg = BenchConfig(num_speculative_tokens=3, ablations={"k8": "models/world/sparrow@8", "same": "runs/a@b"})
    assert speculative_config("k8", cfg)["num_speculative_tokens"] == 8
    assert speculative_config("k8", cfg)["model"] == "models/world/sparrow"
    assert speculative_config("same", cfg) == {"method": "sparrow", "model": "runs/a@b", "num_speculative_tokens": 3}
