"""The GPU check (python -m vllm_sparrow.gpu_check) runs the draft core on a machine with torch and
Triton only, as the borrowed GPU machine has them: here at tiny shapes on CPU, kernels under the
Triton interpreter, from the uninstalled checkout (no site-packages .pth files, so the kernels
folder is not installed) with vLLM, transformers and the demo kit made unimportable. It passes,
reports every part, and fails when a kernel or the graph path computes something else."""

import json
import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SITE = [p for p in site.getsitepackages() if "site-packages" in p]

# Run as on a bare machine: `python -S` skips the .pth files of editable installs (vllm_sparrow and
# its kernels come from the checkout), torch comes from site-packages by PYTHONPATH, and every
# package the draft core must not need is refused on import.
BARE = """
import runpy, sys
for name in ("vllm", "transformers", "sparrow_world"):
    sys.modules[name] = None
{setup}
sys.argv = ["gpu_check"] + {argv!r}
try:
    runpy.run_module("vllm_sparrow.gpu_check", run_name="__main__", alter_sys=True)
finally:
    leaked = [m for m in ("vllm_sparrow.v1_runner.proposer", "vllm_sparrow.patches") if m in sys.modules]
    assert not leaked, leaked
"""


def _run_bare(tmp_path, argv, setup=""):
    out = tmp_path / "report.json"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join(SITE)}
    run = subprocess.run([sys.executable, "-S", "-c", BARE.format(setup=setup, argv=argv + ["--out", str(out)])],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    report = json.loads(out.read_text()) if out.exists() else None
    return run, report


@pytest.fixture(scope="module")
def tiny_report(tmp_path_factory):
    run, report = _run_bare(tmp_path_factory.mktemp("gpu-check"), ["--shapes", "tiny", "--device", "cpu"])
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    return report


def test_the_check_passes_at_tiny_shapes_without_vllm_from_the_checkout(tiny_report):
    env = tiny_report["environment"]
    assert env["vllm_importable"] is False and env["device"] == "cpu"
    assert tiny_report["passed"] and set(tiny_report["parts"]) == {"kernels", "graphs", "memory", "timing"}
    assert all(part["passed"] and "error" not in part for part in tiny_report["parts"].values())


def test_every_kernel_case_is_compared_and_timed(tiny_report):
    kernels = tiny_report["parts"]["kernels"]
    assert len(kernels["cases"]) == 3
    for case in kernels["cases"]:
        assert case["cache_write_exact"] and case["max_abs_error"] <= case["tolerance"]
    assert kernels["timing"]["kernel_ms"] > 0 and kernels["timing"]["torch_reference_ms"] > 0


def test_graph_lockstep_replays_several_buckets_with_prompts_joining(tiny_report):
    (run,) = tiny_report["parts"]["graphs"]["runs"]  # tiny shapes are fp32 only; no capture on CPU
    assert run["dtype"] == "float32" and run["captured"] is False
    assert run["graph_steps"] >= 8 and len(run["buckets_replayed"]) >= 3
    assert run["graph_steps"] < run["steps"]  # the other steps had prompts joining: eager fallback
    assert run["steps_differing"] == {"eager_vs_static": [], "eager_vs_captured": [], "static_vs_captured": []}


def test_timing_covers_every_context_and_batch(tiny_report):
    rows = tiny_report["parts"]["timing"]["rows"]
    assert {(r["context"], r["batch"]) for r in rows} == {(64, 1), (64, 4), (256, 1), (256, 4)}
    for r in rows:
        assert r["target_ms"] > 0 and r["draft_eager_ms"] > 0
        assert r["draft_over_target"] == pytest.approx(r["draft_eager_ms"] / r["target_ms"])


def test_memory_runs_vllms_profile_and_the_mixed_steps(tiny_report):
    memory = tiny_report["parts"]["memory"]
    assert memory["max_requests"] == 16 and memory["window_cache_mib"] > 0
    assert [(m["decodes"], m["chunk_rows"]) for m in memory["mixed_steps"]] == [(5, 40), (3, 30)]
    assert memory["profile_peak_mib"] is None  # CPU: the allocator keeps no statistics


def test_a_kernel_that_computes_something_else_fails_the_check(tmp_path):
    setup = """
from vllm_sparrow.gpu_check.__main__ import kernels_from_checkout
kernels_from_checkout()
import vllm_sparrow_kernels.window_attention as wa
real = wa.ring_window_attention
wa.ring_window_attention = lambda *a, **k: real(*a, **k) * 1.001
"""
    run, report = _run_bare(tmp_path, ["--shapes", "tiny", "--device", "cpu", "--parts", "kernels"], setup)
    assert run.returncode == 1 and "kernels: FAILED" in run.stdout
    assert not report["passed"] and not any(c["passed"] for c in report["parts"]["kernels"]["cases"][1:])


def test_a_graph_path_that_drafts_otherwise_fails_the_check(tmp_path):
    setup = """
import vllm_sparrow.gpu_check.__main__ as m
m.kernels_from_checkout()
from vllm_sparrow.drafting.graphs import DecodeGraphs
real = DecodeGraphs.run
DecodeGraphs.run = lambda self, batch, slots: (real(self, batch, slots) + 1) % 299
"""
    run, report = _run_bare(tmp_path, ["--shapes", "tiny", "--device", "cpu", "--parts", "graphs"], setup)
    assert run.returncode == 1
    (lock,) = report["parts"]["graphs"]["runs"]
    assert lock["steps_differing"]["eager_vs_static"] and not lock["passed"]
