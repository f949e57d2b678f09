"""Every published benchmark number comes from a committed JSON made by a committed command:
the tables in README.md, docs/ and benchmarks/results/ are exactly what benchmarks/publish.py
makes from benchmarks/results/*.json; each JSON carries its registered command and every
output's token ids, and its outputs equal no speculation's; the commands name drafts that exist;
and no speedup, percentage or table of measured decimals stands in README or docs outside a
published block."""

import importlib.util
import json
import math
import re
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def publish():
    spec = importlib.util.spec_from_file_location("publish", ROOT / "benchmarks" / "publish.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_published_table_is_what_its_json_makes(publish):
    assert publish.check() == [], "run `python benchmarks/publish.py render` (or rerun the result)"


def test_blocks_are_filled_one_by_one_and_the_text_between_kept(publish):
    text = "a\n<!-- published: x -->\n<!-- /published -->\nkept\n<!-- published: y -->\nold\n<!-- /published -->\nb\n"
    filled = publish.fill_blocks(text, {"x": lambda: "X", "y": lambda: "Y"})
    assert filled == ("a\n<!-- published: x -->\nX\n<!-- /published -->\nkept\n"
                      "<!-- published: y -->\nY\n<!-- /published -->\nb\n")
    assert publish.fill_blocks(filled, {"x": lambda: "X", "y": lambda: "Y"}) == filled


def test_every_registered_run_has_its_json_with_its_command(publish):
    for name, (command, _) in publish.RUNS.items():
        data = publish.load(name)
        assert data["command"] == command, name
        measured = data.get("records") or data.get("costs")  # a run's rows; `sparrow tune`'s verify costs
        assert data["environment"]["vllm"] and measured, name


def test_every_registered_command_names_the_world_its_json_was_measured_in(publish):
    """`sparrow bench` and the tree replay measure the hard world unless told --world easy: a run
    made on the easy world's models whose command left the world out would, rerun, measure the
    other world."""
    from sparrow_world.bench.config import BenchConfig

    assert BenchConfig().world == "hard"
    for name, (command, _) in publish.RUNS.items():
        argv = shlex.split(command)
        if argv[:2] != ["sparrow", "bench"] and argv[:2] != ["python", "benchmarks/tree_replay.py"]:
            continue  # the other scripts take their models, not a world
        named = argv[argv.index("--world") + 1] if "--world" in argv else "hard"
        settings = publish.load(name)["settings"]
        assert settings.get("world", named) == named, name  # runs before the world was a setting lack it
        models = settings.get("target") or settings.get("models")  # None: the world's own models
        if models:
            folder = re.search(r"models/(world(?:-hard)?)(?:/|$)", models).group(1)
            assert {"world": "easy", "world-hard": "hard"}[folder] == named, name


def test_published_outputs_carry_their_token_ids_and_equal_no_speculation(publish):
    for name in publish.RUNS:
        data = publish.load(name)
        if "decode_tok_s" not in data.get("records", [{}])[0]:
            continue  # not a `sparrow bench` run: the tree replay and op counts generate nothing
        for r in data["records"]:
            assert r["output_token_ids"] and all(r["output_token_ids"]), (name, r["method"])
            assert publish.equal_outputs(data, r), (name, r["method"], r["visual_tokens"], r["batch"])
            assert r["outputs_equal_no_spec"] == publish.equal_outputs(data, r)  # the bench's own flag agrees


def test_the_commands_name_drafts_and_models_that_exist(publish):
    for name, (command, _) in publish.RUNS.items():
        paths = [w for word in shlex.split(command) for w in re.split(r"[=,]", word) if w.startswith("models/")]
        for path in paths:
            folder = ROOT / path.split("@")[0]
            assert folder.is_dir(), f"{name}: {path} does not exist"


def _outside_blocks(text: str) -> str:
    return re.sub(r"<!-- published: [a-z0-9-]+ -->\n.*?<!-- /published -->", "", text, flags=re.S)


@pytest.mark.parametrize("doc", ["README.md", *sorted(p.name for p in (ROOT / "docs").glob("*.md"))])
def test_no_measured_number_stands_outside_a_published_block(doc):
    path = ROOT / doc if doc == "README.md" else ROOT / "docs" / doc
    text = _outside_blocks(path.read_text())
    speedups = re.findall(r"\b\d+(?:\.\d+)?x\b(?! ?\d)", text)
    percents = re.findall(r"\b\d+(?:\.\d+)?%", text)
    tables = [line for line in text.splitlines() if line.startswith("|") and re.search(r"\b\d+\.\d+\b", line)]
    assert not speedups and not percents and not tables, (speedups, percents, tables)


def test_the_plot_is_drawn_from_the_published_json(publish, tmp_path):
    from sparrow_world.bench.report import plot

    data = json.loads((ROOT / "benchmarks" / "results" / "k3.json").read_text())
    plot(data["records"], tmp_path / "k3.png", "test")
    assert (tmp_path / "k3.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (ROOT / "benchmarks" / "results" / "k3.png").is_file()


def test_a_republished_run_starts_clean_and_resumes_only_its_own_unfinished_run(publish, tmp_path, monkeypatch):
    """A bench resumes from the records in its --out; a table republished over an earlier run's
    records would mix two runs. publish.py run empties --out first, and --resume goes on only with
    this same command's run that publish started and that did not finish."""
    script = tmp_path / "fake_bench.py"
    script.write_text(
        "import json, sys, pathlib\n"
        "out = pathlib.Path(sys.argv[sys.argv.index('--out') + 1]); out.mkdir(parents=True, exist_ok=True)\n"
        "records = out / 'records.jsonl'\n"
        "n = len(records.read_text().splitlines()) if records.exists() else 0\n"
        "records.write_text(''.join('{}\\n' for _ in range(n + 1)))\n"
        "if '--die' in sys.argv: sys.exit(3)\n"
        "(out / 'results.json').write_text(json.dumps({'environment': {}, 'records': [n + 1]}))\n")
    out = tmp_path / "run"
    monkeypatch.setattr(publish, "ROOT", tmp_path)
    monkeypatch.setattr(publish, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(publish, "RUNS", {"fake": (f"python {script} --out run", 0),
                                          "dies": (f"python {script} --out run --die", 0)})
    publish.run("fake")
    publish.run("fake")  # the earlier run's records are gone first: one run again
    assert publish.load("fake")["records"] == [1]
    with pytest.raises(Exception):
        publish.run("dies")  # killed partway: its records stay, its stamp says unfinished
    with pytest.raises(SystemExit, match="nothing to resume"):
        publish.run("fake", resume=True)  # another command's unfinished run is not resumed
    with pytest.raises(Exception):
        publish.run("dies", resume=True)  # the same command goes on from its own records
    assert len((out / "records.jsonl").read_text().splitlines()) == 2
    publish.run("fake", resume=False)
    with pytest.raises(SystemExit, match="nothing to resume"):
        publish.run("fake", resume=True)  # finished: nothing to resume


def test_runs_start_with_intel_openmp_preloaded(publish, monkeypatch):
    """vLLM's CPU backend asks for libiomp5 in LD_PRELOAD (speculative decoding loses much of its
    speed without it); `make test` preloads it, and publish's runs must too, or every method is
    measured below its best."""
    iomp = Path(sys.prefix) / "lib" / "libiomp5.so"
    if not iomp.is_file():
        pytest.skip("no libiomp5 in this environment (intel-openmp is installed on CPU builds)")
    monkeypatch.setenv("LD_PRELOAD", "/elsewhere/libx.so")
    assert publish.runtime_env()["LD_PRELOAD"].split(":") == [str(iomp), "/elsewhere/libx.so"]
    monkeypatch.setenv("LD_PRELOAD", str(iomp))
    assert publish.runtime_env()["LD_PRELOAD"] == str(iomp)  # not twice


def test_a_rounds_machine_speed_cancels_in_the_paired_ratio(publish):
    # the machine's speed moves every method of a round alike: tuned 10% ahead of depth 8 in every
    # round is exactly 1.10x however far the rounds drift, though the two ranges overlap widely
    speed = [1.0, 1.6, 0.7, 1.3, 0.9, 1.8, 1.1]
    fixed = [500 * s for s in speed]
    tuned = [550 * s for s in speed]
    assert max(fixed) > min(tuned)
    g, lo, hi = publish.paired_ratio(tuned, fixed)
    assert g == pytest.approx(1.10) and lo == pytest.approx(1.10) and hi == pytest.approx(1.10)
    # the interval is Student's t over the log ratios: by hand for seven rounds (t = 2.447 at 6 df)
    ratios = [1.05, 0.90, 1.02, 0.97, 1.10, 0.95, 0.99]
    logs = [math.log(r) for r in ratios]
    mean, sd = sum(logs) / 7, (sum((x - sum(logs) / 7) ** 2 for x in logs) / 6) ** 0.5
    g, lo, hi = publish.paired_ratio(ratios, [1.0] * 7)
    assert (g, lo, hi) == pytest.approx((math.exp(mean), math.exp(mean - 2.447 * sd / 7 ** 0.5),
                                         math.exp(mean + 2.447 * sd / 7 ** 0.5)))
    assert lo < 1 < hi  # these rounds do not separate the two
    # a method behind in every round by 8-15% lies wholly below 1
    assert publish.paired_ratio([0.92, 0.85, 0.88, 0.90], [1.0] * 4)[2] < 1
