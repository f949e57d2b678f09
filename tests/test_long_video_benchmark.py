"""`sparrow bench --quick` (the CI smoke size of the long-video benchmark) measures every method
on the demo models through vLLM, at batch size 1 and with clips submitted together, in rounds
whose method order changes, and writes the JSON records, the markdown table and the plot."""

import json
import subprocess
import sys
from pathlib import Path

METHODS = ("none", "sparrow", "eagle", "eagle3", "ngram", "untrained")


def test_quick_benchmark_measures_every_method_at_every_length(quick_bench):
    cfg, records = quick_bench
    assert set(records) == {(m, n, b) for m in METHODS for n in cfg.lengths for b in cfg.batch_sizes}
    assert len((Path(cfg.out) / "records.jsonl").read_text().splitlines()) == len(records) * cfg.rounds
    assert max(cfg.batch_sizes) > 1
    for (method, n, b), r in records.items():
        assert r["decode_tok_s"] > 0 and r["e2e_s"] > 0
        assert len(r["prompt_tokens"]) == (cfg.clips_per_length if b == 1 else b)
        assert len(set(map(tuple, r["output_token_ids"]))) == len(r["output_token_ids"]), "different clips"
        # the prompt holds the clip's visual tokens: the length axis is real
        assert n <= r["prompt_tokens"][0] <= n + 64, (method, n, r["prompt_tokens"])
        # the target's own forwards, timed inside the decode phase: what is left is the method's
        # drafting and the engine's bookkeeping (the distance to the method's limit)
        assert r["target_forward_s"] > 0 and all(0 < x < 1 for x in r["per_round"]["outside_forward_share"]), r
        if method != "none":
            assert r["drafts"] > 0 and r["draft_ms_per_step"] > 0
            assert len(r["per_position"]) == cfg.num_speculative_tokens
            assert r["limit_speedup"] > 0
            if b == 1:  # each clip's own counters (flatness is judged scene by scene): they add up to the cell's
                assert len(r["per_clip"]) == cfg.clips_per_length
                assert sum(p["drafts"] for p in r["per_clip"]) * cfg.rounds == r["drafts"]
                assert sum(p["accepted"] for p in r["per_clip"]) * cfg.rounds == r["accepted"]
            # drafting happens outside the target's forward: a drafting method spends more there
            if method in ("sparrow", "eagle", "eagle3") and b == 1:
                assert r["outside_forward_share"] > records[("none", n, b)]["outside_forward_share"], (method, n, b)
        if method not in ("none", "ngram"):  # (ngram drafts only where the text repeats)
            # the counters match the outputs: a verify step yields its accepted drafts + 1 token,
            # the prefill one more per request, and a request's last step may overshoot max
            # tokens or end at EOS (dropping up to K) or go undrafted (one token)
            # (counters are pooled over the rounds, each of which produced these outputs)
            produced, reqs = sum(len(ids) for ids in r["output_token_ids"]), len(r["output_token_ids"])
            upper = reqs + (r["drafts"] + r["accepted"]) / cfg.rounds
            assert upper - reqs * cfg.num_speculative_tokens <= produced <= upper + reqs, (method, n, b, produced, upper)


def test_every_method_reproduces_the_no_speculation_captions(quick_bench):
    _, records = quick_bench
    assert all(r["outputs_equal_no_spec"] for r in records.values()), \
        [(k, r["outputs_equal_no_spec"]) for k, r in records.items()]


def test_draft_cache_holds_text_only_for_sparrow_and_every_token_for_eagle(quick_bench):
    """Both measured, then held to what each cache must hold. Sparrow: one ring per request of
    the same size at every length, with room for the A anchors, the W window and the K - 1
    chained entries, and no more than one step's worth besides. EAGLE (vLLM's draft KV): the
    blocks vLLM's scheduler held for the request hold every one of its tokens, visual ones
    included, with less than a block (plus the K lookahead slots) to spare."""
    cfg, records = quick_bench
    short, long = cfg.lengths[0], cfg.lengths[-1]
    draft = json.loads((Path(cfg.sparrow) / "config.json").read_text())
    layer = draft["transformer_layer_config"]
    row = 2 * layer["num_key_value_heads"] * layer["head_dim"] * 4  # K and V of one entry, float32
    need = draft["anchor_tokens"] + draft["window_tokens"] + cfg.num_speculative_tokens - 1
    sizes = {records[("sparrow", n, 1)]["draft_cache_bytes"] for n in (short, long)}
    assert len(sizes) == 1, sizes  # one fixed ring per request, whatever the video length
    assert need * row <= sizes.pop() <= (need + cfg.num_speculative_tokens + 1) * row
    eagle = json.loads((Path(cfg.eagle) / "config.json").read_text())
    per_token = 2 * eagle.get("num_key_value_heads", eagle["num_attention_heads"]) * (
        eagle.get("head_dim") or eagle["hidden_size"] // eagle["num_attention_heads"]) * 4
    for n in (short, long):
        r = records[("eagle", n, 1)]
        block_tokens = r["draft_kv_bytes_per_block"] / per_token  # vLLM's block size
        assert block_tokens == int(block_tokens) and block_tokens >= 1, r["draft_kv_bytes_per_block"]
        for prompt, out, blocks in zip(r["prompt_tokens"], r["output_token_ids"], r["kv_blocks"]):
            tokens = prompt + len(out)
            assert tokens - 1 <= blocks * block_tokens < tokens + block_tokens + cfg.num_speculative_tokens + 1
        # the published column is that measurement: blocks held times bytes per block
        assert r["draft_cache_bytes"] == r["draft_kv_bytes_per_block"] * sum(r["kv_blocks"]) / len(r["kv_blocks"])
    assert records[("eagle", long, 1)]["draft_cache_bytes"] > 2 * records[("eagle", short, 1)]["draft_cache_bytes"]


def test_each_number_is_the_median_of_rounds_with_its_range(quick_bench):
    """Every record summarises cfg.rounds measurements: timed values are the median with [min,
    max] beside them, speedups taken within each round (against that round's no-speculation
    engine), the greedy outputs the same in every round."""
    import statistics

    cfg, records = quick_bench
    assert cfg.rounds >= 2
    for key, r in records.items():
        assert r["rounds"] == cfg.rounds and r["outputs_equal_across_rounds"], key
        for name in ("decode_tok_s", "e2e_s", *(("decode_speedup",) if key[0] != "none" else ())):
            values = r["per_round"][name]
            assert len(values) == cfg.rounds and r[name] == statistics.median(values), (key, name)
            assert r[name + "_range"] == [min(values), max(values)], (key, name)
    for (method, n, b), r in records.items():
        base = records[("none", n, b)]["per_round"]["decode_tok_s"]
        assert r["per_round"]["decode_speedup"] == [t / t0 for t, t0 in zip(r["per_round"]["decode_tok_s"], base)]


def test_rounds_change_which_method_each_method_follows():
    """The order effect: the method measured right after `none` came out worst in every run. Each
    round takes a Williams-square row, so over three rounds of four to eight methods no method
    follows the same method twice, nor sits at the same place twice where avoidable."""
    from sparrow_world.bench.run import round_orders

    for m in range(2, 9):
        methods = [f"m{i}" for i in range(m)]
        orders = round_orders(methods, 3)
        assert all(sorted(o) == methods for o in orders)
        before = [(a, b) for o in orders for a, b in zip(o, o[1:])]
        assert len(set(before)) == len(before) or m < 4, (m, orders)
    assert round_orders(["none", "sparrow"], 2) == [["none", "sparrow"], ["sparrow", "none"]]


def test_summary_pools_counters_and_flags_outputs_that_differ_between_rounds():
    from sparrow_world.bench.run import summarize

    def rec(method, r, tok_s, ids, drafts=0, accepted=0, per_pos=None):
        out = {"method": method, "visual_tokens": 512, "batch": 1, "round": r, "decode_tok_s": tok_s, "e2e_s": 1.0,
               "output_token_ids": ids}
        if drafts:
            out.update(drafts=drafts, accepted=accepted, draft_tokens=3 * drafts, per_position=per_pos)
        return out

    done = {("none", 512, 1, 0): rec("none", 0, 10.0, [[1, 2]]), ("none", 512, 1, 1): rec("none", 1, 20.0, [[1, 2]]),
            ("s", 512, 1, 0): rec("s", 0, 30.0, [[1, 2]], 10, 20, [1.0, 0.6, 0.4]),
            ("s", 512, 1, 1): rec("s", 1, 30.0, [[1, 3]], 30, 30, [0.6, 0.2, 0.2])}
    none, s = summarize(done, ["none", "s"], [(512, 1)], 2)
    assert s["per_round"]["decode_speedup"] == [3.0, 1.5] and s["decode_speedup"] == 2.25
    assert s["decode_speedup_range"] == [1.5, 3.0] and "round" not in s
    assert (s["drafts"], s["accepted"], s["acceptance_length"]) == (40, 50, 2.25)
    assert [round(p, 3) for p in s["per_position"]] == [0.7, 0.3, 0.25]
    assert not s["outputs_equal_no_spec"] and not s["outputs_equal_across_rounds"]
    assert none["outputs_equal_across_rounds"] and none["decode_tok_s"] == 15.0


def test_results_json_table_and_plot_are_written(quick_bench):
    cfg, records = quick_bench
    out = Path(cfg.out)
    results = json.loads((out / "results.json").read_text())
    assert len(results["records"]) == len(records)
    assert results["environment"]["vllm"].startswith("0.32.0")
    assert results["settings"]["lengths"] == list(cfg.lengths)
    table = (out / "table.md").read_text()
    assert "CPU only" in table or "GPU" in table
    sparrow_rows = [line for line in table.splitlines() if line.startswith("| sparrow |")]
    assert len(sparrow_rows) == len(cfg.lengths) * len(cfg.batch_sizes)
    lo, hi = records[("sparrow", cfg.lengths[0], 1)]["decode_speedup_range"]
    assert f"({lo:.2f}-{hi:.2f})" in sparrow_rows[0] and f"over {cfg.rounds} rounds" in table
    assert (out / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_run_killed_while_writing_a_record_measures_only_what_is_missing(tmp_path):
    """SIGKILL half way through the second record: the rerun keeps the first and measures the
    second length only."""
    import os
    import signal

    models = Path(__file__).resolve().parents[1] / "models" / "world"
    cmd = [sys.executable, "-m", "vllm_sparrow.cli", "bench", "--world", "easy", "--out", str(tmp_path / "b"),
           "--methods", "none", "--lengths", "512,1536", "--clips", "1", "--max-tokens", "16", "--rounds", "1",
           "--target", str(models / "target")]
    env = {**os.environ, "SPARROW_KILL_AT_WRITE": "2:records"}
    killed = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert (tmp_path / "b" / "records.jsonl").read_bytes().count(b"\n") == 1  # one whole record, one torn
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    measured = [line for line in done.stdout.splitlines() if line.startswith("[bench ")]
    assert len(measured) == 1 and "@   1536 visual tokens" in measured[0], measured
    rows = [json.loads(x) for x in (tmp_path / "b" / "records.jsonl").read_text().splitlines()]
    assert [r["visual_tokens"] for r in rows] == [512, 1536]


def test_rerun_of_a_finished_run_only_rewrites_the_reports(quick_bench):
    cfg, records = quick_bench
    # a finished run: the CLI only rewrites the reports (no engine is started)
    done = subprocess.run([sys.executable, "-m", "vllm_sparrow.cli", "bench", "--world", "easy", "--quick",
                           "--out", cfg.out,
                           "--target", cfg.target, "--sparrow", cfg.sparrow, "--eagle", cfg.eagle, "--eagle3", cfg.eagle3,
                           "--k", str(cfg.num_speculative_tokens),
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


def test_an_ablation_can_set_fields_of_the_drafts_config(tmp_path):
    """--ablation NAME=DIR@K,FIELD=VALUE serves a copy of the draft with those fields set (the
    documented tree-search and adaptive-length runs need no hand-made draft folder)."""
    import pytest

    from sparrow_world.bench.config import BenchConfig
    from sparrow_world.bench.engines import speculative_config
    from vllm_sparrow.config import SparrowConfig

    cfg = BenchConfig(out=str(tmp_path), ablations={"tree3": "models/world/sparrow@4,tree_topk=3,stop_confidence=0.7",
                                                     "bad": "models/world/sparrow,nonsense=1"})
    spec = speculative_config("tree3", cfg)
    assert spec["num_speculative_tokens"] == 4 and spec["model"] == str(tmp_path / "drafts" / "tree3")
    variant, original = SparrowConfig.load(spec["model"]), SparrowConfig.load("models/world/sparrow")
    assert (variant.tree_topk, variant.stop_confidence) == (3, 0.7)
    assert variant.replace(tree_topk=None, stop_confidence=None) == original
    assert (tmp_path / "drafts" / "tree3" / "model.safetensors").resolve() == \
        (Path("models/world/sparrow") / "model.safetensors").resolve()
    with pytest.raises(ValueError, match="FIELD=VALUE"):
        speculative_config("bad", cfg)


def _bench_config(argv):
    """BenchConfig as `sparrow bench ARGV` builds it (no engine)."""
    import argparse

    from sparrow_world.bench.config import BenchConfig
    from sparrow_world.commands import add_bench
    from vllm_sparrow.knobs import from_args

    parser = argparse.ArgumentParser()
    add_bench(parser.add_subparsers())
    return from_args(BenchConfig, parser.parse_args(["bench", *argv]))


def test_k_defaults_to_the_sparrow_drafts_recommended_depth_for_every_method(tmp_path):
    """Without --k the bench drafts at the depth the Sparrow draft's config.json recommends (what
    the plugin drafts when num_speculative_tokens is not given), and the baselines draft at that
    same K; the settings record it. --k sets it for every method."""
    from sparrow_world.bench.engines import speculative_config
    from vllm_sparrow.config import SparrowConfig

    shipped = "models/world/sparrow"
    assert SparrowConfig.load(shipped).speculative_tokens == 8
    deeper = tmp_path / "draft"
    deeper.mkdir()
    SparrowConfig.load(shipped).replace(speculative_tokens=5).save(deeper)
    for argv, k in (([], 8), (["--sparrow", str(deeper)], 5), (["--k", "3"], 3)):
        cfg = _bench_config(argv)
        assert cfg.num_speculative_tokens == k and cfg.settings()["num_speculative_tokens"] == k
        methods = ("sparrow", "eagle", "eagle3", "ngram")
        assert {m: speculative_config(m, cfg)["num_speculative_tokens"] for m in methods} == dict.fromkeys(methods, k)


def test_a_drafting_method_without_k_or_draft_is_refused_and_no_speculation_needs_neither(tmp_path):
    import pytest

    from sparrow_world.bench.engines import speculative_config

    cfg = _bench_config(["--sparrow", str(tmp_path / "missing")])
    assert cfg.num_speculative_tokens is None and speculative_config("none", cfg) is None
    with pytest.raises(SystemExit, match="--k"):
        speculative_config("eagle", cfg)


def test_dtype_and_graphs_default_to_what_cpu_runs_and_can_be_set():
    """float32 (vLLM's "auto" would downcast the float32 demo models and change the outputs), eager
    on CPU and CUDA graphs where the device is CUDA; --dtype bfloat16 and --cuda-graphs on|off pass
    through to the engine arguments."""
    import torch

    from sparrow_world.bench.config import enforce_eager

    cfg = _bench_config([])
    assert (cfg.dtype, cfg.cuda_graphs) == ("float32", "auto")
    assert enforce_eager(cfg) is (not torch.cuda.is_available())
    cfg = _bench_config(["--dtype", "bfloat16", "--cuda-graphs", "on"])
    assert (cfg.dtype, enforce_eager(cfg)) == ("bfloat16", False)
    assert enforce_eager(_bench_config(["--cuda-graphs", "off"])) is True


def test_the_default_models_are_found_from_any_folder(tmp_path, monkeypatch):
    """Outside the checkout `sparrow bench` ended in a Hugging Face "Repo id" traceback: its
    defaults (models/world/...) were read relative to the working directory."""
    from sparrow_world.bench.config import BenchConfig

    monkeypatch.chdir(tmp_path)
    cfg = BenchConfig()
    for path in (cfg.target, cfg.sparrow, cfg.eagle, cfg.eagle3):
        assert Path(path).is_absolute() and (Path(path) / "config.json").is_file(), path
    assert cfg.num_speculative_tokens == 8  # read from the shipped draft found there
    assert Path(cfg.target).parent.name == "world-hard"  # the bench's default world is the hard one
    (tmp_path / "models" / "world-hard" / "target").mkdir(parents=True)  # a folder of the user's own wins
    assert BenchConfig(sparrow=str(Path(cfg.sparrow))).target == "models/world-hard/target"
    assert Path(BenchConfig(world="easy").target).parent.name == "world"


def test_quick_sets_only_the_sizes_the_command_line_left_out():
    """`--quick` overrode an explicit --batch-sizes."""
    from sparrow_world.bench.config import QUICK, BenchConfig
    from sparrow_world.commands import bench_config
    from vllm_sparrow.cli import build_parser

    parse = lambda *a: bench_config(build_parser().parse_args(["bench", *a]))  # noqa: E731
    assert parse("--quick").batch_sizes == QUICK["batch_sizes"] and parse("--quick").lengths == QUICK["lengths"]
    mine = parse("--quick", "--batch-sizes", "1,4", "--clips", "3")
    assert (mine.batch_sizes, mine.clips_per_length, mine.lengths) == ((1, 4), 3, QUICK["lengths"])
    plain = parse()
    assert (plain.batch_sizes, plain.lengths) == (BenchConfig.batch_sizes, BenchConfig.lengths)


def test_with_ablations_takes_every_shipped_ablation_of_the_worlds_draft():
    from sparrow_world.commands import bench_from_args
    from vllm_sparrow.cli import build_parser

    cfg = bench_from_args(build_parser().parse_args(["bench", "--with-ablations", "--ablation", "k8=x@8"]))
    shipped = sorted(d.name for d in (Path(cfg.sparrow).parent / "ablations").iterdir())
    assert shipped and sorted(cfg.ablations) == sorted(shipped + ["k8"])
    assert all(Path(cfg.ablations[name]).parent.parent == Path(cfg.sparrow).parent for name in shipped)
    assert Path(cfg.target).parent.name == "world-hard"  # the default world
    easy = bench_from_args(build_parser().parse_args(["bench", "--world", "easy"]))
    assert Path(easy.target).parent.name == "world"
