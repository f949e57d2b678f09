"""`benchmarks/mixed_step.py --quick` (one round: a 200-token text prompt joins 4 decoding video
requests) times the draft call of the very step that carries the prompt's whole chunk besides
the decodes, and of a decode-only step before it, for Sparrow and EAGLE, with no speculation's
step times beside; its results.json carries what a published run carries, and the outputs agree
with no speculation's."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
K = 3  # the script's default (the table)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("mixed-step") / "out"
    done = subprocess.run([sys.executable, "benchmarks/mixed_step.py", "--quick", "--methods", "none,sparrow,eagle",
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / "results.json").read_text()), out, done.stdout


def test_the_join_steps_draft_call_is_timed_with_the_whole_prompt_chunk_in_it(quick_run):
    data, _, _ = quick_run
    assert sorted(r["method"] for r in data["records"]) == ["eagle", "none", "sparrow"]
    for r in data["records"]:
        per_decode = 1 if r["method"] == "none" else K + 1  # the decode's token and its K drafts
        assert r["join"]["scheduled"] == {"prompt": 200, "decodes": 4, "decode_tokens": 4 * per_decode, "other": []}
        assert r["decode_only"]["scheduled"] == {"prompt": 0, "decodes": 4, "decode_tokens": 4 * per_decode,
                                                 "other": []}
        assert r["join"]["step_ms"] > 0 and r["decode_only"]["step_ms"] > 0
        if r["method"] == "none":
            assert "draft_ms" not in r["join"]
            continue
        for part in ("join", "decode_only"):
            # the timed call drafted for that very step, and is part of its wall time
            assert r[part]["drafted_for"] == r[part]["scheduled"]
            assert 0 < r[part]["draft_ms"] < r[part]["step_ms"]


def test_results_carry_each_value_the_medians_the_environment_and_the_command(quick_run):
    data, out, stdout = quick_run
    assert {"gpu", "cpu_count", "date", "vllm", "torch"} <= set(data["environment"])
    assert data["environment"]["vllm"].startswith("0.32.0")
    assert data["command_line"].startswith("python benchmarks/mixed_step.py --quick")
    s = data["settings"]
    assert (s["k"], s["decodes"], s["prompt_tokens"], s["rounds"]) == (K, 4, [200], 1)
    for method, engine in data["settings"]["engines"].items():  # --dtype reached the target and the draft
        assert engine["dtypes"] == {"target": "float32", "draft": None if method == "none" else "float32"}
    rows = {row["method"]: row for row in data["summary"]}
    for m in ("sparrow", "eagle"):
        cell = rows[m]["join_draft_ms"]
        assert cell["values"] == [r["join"]["draft_ms"] for r in data["records"] if r["method"] == m]
        assert cell["median"] == cell["values"][0]
    assert "join_draft_ms" not in rows["none"] and rows["none"]["join_step_ms"]["values"]
    table = (out / "table.md").read_text()
    assert sum(line.startswith("| ") for line in table.splitlines()) == 1 + 3 and table.splitlines()[-1] in stdout


def test_every_methods_outputs_agree_with_no_speculations(quick_run):
    data, _, _ = quick_run
    assert data["outputs_agree_with_none"] is True
    by = {r["method"]: r["output_token_ids"] for r in data["records"]}
    assert all(ids for outputs in by.values() for ids in outputs["video"])  # nothing agrees vacuously
    assert by["sparrow"]["text"] == by["eagle"]["text"] == by["none"]["text"] != []


def test_the_arriving_prompt_has_exactly_the_asked_number_of_tokens():
    from transformers import AutoTokenizer

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from mixed_step import text_prompt_ids

    from sparrow_world.tiny_targets import make_prompt

    tok = AutoTokenizer.from_pretrained(str(ROOT / "models" / "world" / "target"))
    template_head = make_prompt("qwen2_5_vl", tok, "\x00", media=None).split("\x00")[0]
    head = tok(template_head, add_special_tokens=False)["input_ids"]
    prompts = {(n, shift): text_prompt_ids(tok, n, shift) for n in (60, 600, 3000) for shift in (0, 1)}
    for (n, _), ids in prompts.items():
        assert len(ids) == n and ids[: len(head)] == head
    assert prompts[(600, 0)] != prompts[(600, 1)]  # rounds do not repeat a prompt
