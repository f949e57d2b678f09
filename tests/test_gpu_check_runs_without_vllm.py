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
    assert tiny_report["passed"] and set(tiny_report["parts"]) == {"kernels", "graphs", "memory", "costs", "modes",
                                                                   "positions"}
    assert all(part["passed"] and "error" not in part for part in tiny_report["parts"].values())


def test_the_check_drafts_past_positions_32768_and_65536(tiny_report):
    positions = tiny_report["parts"]["positions"]
    assert all(positions["crossed"].values()), positions
    assert positions["argmax_equal"] and positions["worst_relative_logit_error"] <= 1e-3, positions
    assert min(positions["steps_checked"].values()) >= 3, positions


def test_kernel_cases_are_the_served_layouts_over_fresh_full_and_wrapped_rings(tiny_report):
    kernels = tiny_report["parts"]["kernels"]
    assert [c["batch"] for c in kernels["cases"]] == [1, 5, 12] and {c["rows"] for c in kernels["cases"]} == {1}
    one, _, every = kernels["cases"]
    assert one["wrapped_slots"] == 1  # a batch of one is a request deep into its answer, not a fresh one
    assert 0 in every["histories"] and every["wrapped_slots"] >= 3  # fresh to wrapped many times over
    assert sum(c["padding_rows"] for c in kernels["cases"]) >= 1
    for case in kernels["cases"]:
        assert case["dtype"] == "float32" and case["tolerance"] == 1e-5
        assert case["cache_write_exact"] and case["max_abs_error"] <= case["tolerance"]
    (timing,) = kernels["timing"]
    assert timing["rows"] == 1 and timing["kernel_ms"] > 0 and timing["torch_ms"] > 0


def test_graph_lockstep_at_the_shipped_depth_with_requests_joining_and_leaving(tiny_report):
    (run,) = tiny_report["parts"]["graphs"]["runs"]  # tiny shapes are fp32 only; no capture on CPU
    assert run["dtype"] == "float32" and run["captured"] is False and run["k"] == 3
    assert run["buckets"] == [1, 2, 4, 8, 12] and max(run["buckets_replayed"]) == 12  # the largest bucket too
    assert run["graph_steps"] >= 8 and len(run["buckets_replayed"]) >= 3
    assert run["left"] >= run["steps"] and run["joined"] > 12  # someone leaves every step; slots reused
    assert run["graph_steps"] < run["steps"]  # the other steps had prompts joining: eager fallback
    assert run["steps_differing"] == {"eager_vs_static": [], "eager_vs_captured": [], "static_vs_captured": []}


def test_costs_give_one_more_verified_token_and_one_more_draft_forward(tiny_report):
    rows = tiny_report["parts"]["costs"]["rows"]
    assert {(r["context"], r["batch"]) for r in rows} == {(64, 1), (64, 4), (256, 1), (256, 4)}
    for r in rows:
        assert set(r["target_ms"]) == {"1", "4", "7"} and all(ms > 0 for ms in r["target_ms"].values())
        one = r["target_ms"]["1"]
        assert r["verify_token_cost"]["7"] == pytest.approx((r["target_ms"]["7"] - one) / 6 / one)
        assert set(r["draft_step_ms"]) == {"1", "3"} and set(r["chained_forward_cost"]) == {"1", "2"}
        steps = r["draft_step_ms"]
        assert r["draft_forward_cost"] == pytest.approx((steps["3"] - steps["1"]) / 2 / one)


def test_memory_counts_every_configuration_at_the_bound(tiny_report):
    memory = tiny_report["parts"]["memory"]
    assert memory["meter"] == "size model" and memory["max_requests"] == 16 and memory["window_cache_mib"] > 0
    configs = {c["config"]: c for c in memory["configs"]}
    assert set(configs) == {"chain", "sampled", "tree"}
    for c in configs.values():
        assert [(st["decodes"], st["chunk_rows"]) for st in c["steps"]] == [(15, 4), (16, 0)]
        assert all(0 < st["peak_mib"] <= c["profile_peak_mib"] for st in c["steps"])
    # the sampled engine's q buffer is held from load, not allocated by its steps
    assert configs["sampled"]["load_mib"] - configs["chain"]["load_mib"] == pytest.approx(memory["q_buffer_mib"], abs=0.02)


def test_a_sampled_engine_at_1024_requests_and_7b_widths_allocates_nothing_outside_its_profile(tmp_path):
    """vLLM's GPU defaults (1,024 requests, 16,384-token steps, K = 8, a 152k vocabulary), on the
    meta device: sizes counted, nothing allocated."""
    run, report = _run_bare(tmp_path, ["--shapes", "7b", "--device", "meta", "--parts", "memory"])
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    memory = report["parts"]["memory"]
    sampled = next(c for c in memory["configs"] if c["config"] == "sampled")
    assert memory["max_requests"] == 1024 and memory["k"] == 8 and memory["q_buffer_mib"] > 4000
    assert [st["decodes"] for st in sampled["steps"]] == [1023, 1024] and sampled["steps"][0]["chunk_rows"] > 7000
    assert sampled["passed"] and all(st["peak_mib"] <= sampled["profile_peak_mib"] for st in sampled["steps"])
    assert sampled["load_mib"] >= memory["q_buffer_mib"] + memory["window_cache_mib"]


def test_the_modes_users_switch_on_run_and_hold(tiny_report):
    modes = tiny_report["parts"]["modes"]["modes"]
    assert set(modes) == {"tree_search", "adaptive_length", "sampled", "reduced_vocab", "target_token_io"}
    assert all(m["passed"] for m in modes.values())


# ---- planted bugs: each makes the check exit 1 ------------------------------------------------

KERNEL_WRAPPER = """
from vllm_sparrow.gpu_check.__main__ import kernels_from_checkout
kernels_from_checkout()
import vllm_sparrow_kernels.window_attention as wa
real = wa.ring_window_attention
def planted(q, k, v, kc, vc, slots, pos, valid, cache_len, anchors, window, ring, scale, **kw):
{body}
wa.ring_window_attention = planted
"""


def _kernel_fails(tmp_path, body: str) -> dict:
    setup = KERNEL_WRAPPER.format(body="\n".join("    " + line for line in body.strip().splitlines()))
    run, report = _run_bare(tmp_path, ["--shapes", "tiny", "--device", "cpu", "--parts", "kernels"], setup)
    assert run.returncode == 1 and "kernels: FAILED" in run.stdout, run.stdout[-2000:] + run.stderr[-2000:]
    assert not report["passed"]
    return {c["batch"]: c for c in report["parts"]["kernels"]["cases"]}


def test_a_kernel_that_computes_something_else_fails_the_check(tmp_path):
    cases = _kernel_fails(tmp_path, "return real(q, k, v, kc, vc, slots, pos, valid, cache_len, anchors, window, "
                                    "ring, scale) * 1.001")
    assert not any(c["passed"] for c in cases.values())


def test_a_mask_one_key_wider_fails_the_check(tmp_path):
    cases = _kernel_fails(tmp_path, "return real(q, k, v, kc, vc, slots, pos, valid, cache_len, anchors, window + 1, "
                                    "ring, scale)")
    assert not cases[1]["passed"] and cases[1]["cache_write_exact"]  # the reads, not the write


def test_a_ring_index_off_by_one_on_wrapped_slots_fails_the_check(tmp_path):
    # reads a wrapped slot's ring as if it held one entry more; slots that never wrapped read right
    cases = _kernel_fails(tmp_path, """
wrapped = cache_len > anchors + ring
return real(q, k, v, kc, vc, slots, pos, valid, cache_len + wrapped.long(), anchors, window, ring, scale)""")
    assert not cases[1]["passed"]


def test_a_graph_path_that_drafts_otherwise_fails_the_check(tmp_path):
    setup = """
import vllm_sparrow.gpu_check.__main__ as m
m.kernels_from_checkout()
from vllm_sparrow.drafting.graphs import DecodeGraphs
real = DecodeGraphs.run
DecodeGraphs.run = lambda self, batch, slots, **kw: (real(self, batch, slots, **kw) + 1) % 299
"""
    run, report = _run_bare(tmp_path, ["--shapes", "tiny", "--device", "cpu", "--parts", "graphs"], setup)
    assert run.returncode == 1
    (lock,) = report["parts"]["graphs"]["runs"]
    assert lock["steps_differing"]["eager_vs_static"] and not lock["passed"]


def test_a_profile_that_drafts_otherwise_than_the_engine_fails_the_check(tmp_path):
    # the profile as it was before: the greedy chain whatever the engine drafts with
    setup = """
import vllm_sparrow.gpu_check.__main__ as m
m.kernels_from_checkout()
from vllm_sparrow.drafter import SparrowDrafter
from vllm_sparrow.drafting.chain import CHAIN
real = SparrowDrafter.profile_step
SparrowDrafter.profile_step = lambda self, tokens, requests, k, drafting=None, sample=None: real(self, tokens, requests, k, CHAIN)
"""
    run, report = _run_bare(tmp_path, ["--shapes", "tiny", "--device", "cpu", "--parts", "memory"], setup)
    assert run.returncode == 1 and "memory: FAILED" in run.stdout
    configs = {c["config"]: c for c in report["parts"]["memory"]["configs"]}
    assert configs["chain"]["passed"] and not configs["tree"]["passed"]


def test_positions_that_wrap_at_32768_fail_the_check(tmp_path):
    setup = """
import vllm_sparrow.gpu_check.__main__ as m
m.kernels_from_checkout()
import vllm_sparrow.serving_layer as layer
real = layer.SparrowServingLayer.project
layer.SparrowServingLayer.project = lambda self, hidden, embeds, positions: real(self, hidden, embeds, positions % 32768)
"""
    run, report = _run_bare(tmp_path, ["--shapes", "tiny", "--device", "cpu", "--parts", "positions"], setup)
    assert run.returncode == 1
    assert report["parts"]["positions"]["worst_relative_logit_error"] > 1e-3
