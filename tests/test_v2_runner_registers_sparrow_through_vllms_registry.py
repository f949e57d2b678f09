"""Under vLLM 0.34's own Python (`make test-v2-runner`): the "sparrow" method of its registry of
speculative methods (vllm_sparrow/v2_runner/method.py) builds real 0.34 SpeculativeConfigs for the
shipped hard-world draft, validated against its target, its depth the draft's own, Sparrow's options
taken from speculator_options and refused with what to use; and the plugin never stops 0.34 from
starting: it patches nothing there and sets no environment variable (0.34 refuses any
VLLM_USE_V2_MODEL_RUNNER but 1), and on a release it does not know it steps aside naming the ones
it supports. Plugin cases run in fresh processes (the plugin sets itself up once per process)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from vllm_sparrow.read_check import supported_versions_text
from vllm_sparrow.releases import release

ROOT = Path(__file__).resolve().parents[1]
TARGET, DRAFT = ROOT / "models/world-hard/target", ROOT / "models/world-hard/sparrow"


@pytest.fixture(scope="module")
def registered():
    from vllm.config import ModelConfig

    import vllm

    from vllm_sparrow.v2_runner.method import register

    register(vllm.__version__)
    return ModelConfig(model=str(TARGET), dtype="float32", max_model_len=8192)


def _spec(target, **kw):
    from vllm.config import ParallelConfig, SpeculativeConfig

    return SpeculativeConfig(method="sparrow", model=str(DRAFT), target_model_config=target,
                             target_parallel_config=ParallelConfig(), **kw)


def test_the_registered_method_builds_a_config_for_the_draft(registered):
    from vllm_sparrow.config import SparrowConfig
    from vllm_sparrow.v2_runner.method import SPECULATOR, SparrowSpeculatorConfig

    spec = _spec(registered)
    assert spec.custom_method == "sparrow" and spec.method is None  # no built-in method underneath
    assert spec.num_speculative_tokens == SparrowConfig.load(DRAFT).speculative_tokens
    assert type(spec.speculator_config) is SparrowSpeculatorConfig
    assert spec.speculator_config.speculator_class == SPECULATOR
    assert spec.speculator_config.num_prefill_lookahead_tokens == 1  # the token after a prefill chunk
    assert spec.draft_model_config is registered  # vLLM parses nothing of the draft directory
    assert _spec(registered, num_speculative_tokens=3).num_speculative_tokens == 3


def test_sparrow_options_travel_in_speculator_options_and_bad_ones_are_refused(registered):
    spec = _spec(registered, speculator_options={"stop_confidence": 0.3, "draft_graphs": "off"})
    assert spec.speculator_options == {"stop_confidence": 0.3, "draft_graphs": "off"}
    with pytest.raises(ValueError, match=r"'tree_width' is not a Sparrow option: use attention_backend, "
                                         r"draft_graphs, .*stop_confidence, tree_budget, tree_topk"):
        _spec(registered, speculator_options={"tree_width": 4})
    with pytest.raises(ValueError, match=r"speculator_options.stop_confidence=2.0: use a probability in \(0, 1\)"):
        _spec(registered, speculator_options={"stop_confidence": 2})


def test_a_draft_the_target_cannot_serve_is_refused_with_what_to_do(registered):
    with pytest.raises(ValueError, match=r"needs \"model\": the Sparrow draft directory"):
        from vllm.config import ParallelConfig, SpeculativeConfig

        SpeculativeConfig(method="sparrow", num_speculative_tokens=3, target_model_config=registered,
                          target_parallel_config=ParallelConfig())
    with pytest.raises(ValueError, match=r"num_speculative_tokens"):
        _spec(registered, num_speculative_tokens=99)


def _run(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "VLLM_USE_V2_MODEL_RUNNER"}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True,
                          text=True, timeout=600)


def test_on_vllm_034_the_plugin_registers_sparrow_patches_nothing_and_sets_no_environment():
    done = _run("""
        import os
        import vllm
        from vllm_sparrow import patches
        from vllm_sparrow.plugin import register
        from vllm.v1.worker.gpu.spec_decode.speculator_config import registered_speculative_methods
        register()
        print("VERSION", vllm.__version__, "APPLIED", len(patches.APPLIED),
              "ENV", "VLLM_USE_V2_MODEL_RUNNER" in os.environ, "METHODS", registered_speculative_methods())
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    version = done.stdout.split("VERSION ", 1)[1].split()[0]
    assert release(version).runner == "v2" and f"VERSION {version} APPLIED 0 ENV False" in done.stdout
    assert "METHODS ['sparrow']" in done.stdout


def test_on_a_release_it_does_not_know_the_plugin_steps_aside_naming_the_supported_ones():
    done = _run("""
        import vllm
        vllm.__version__ = "0.99.0"
        from vllm_sparrow import patches
        from vllm_sparrow.plugin import register
        from vllm.v1.worker.gpu.spec_decode.speculator_config import registered_speculative_methods
        register()
        print("APPLIED", len(patches.APPLIED), "METHODS", registered_speculative_methods())
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "APPLIED 0 METHODS []" in done.stdout
    log = done.stdout + done.stderr
    assert release("0.99.0") is None
    assert f"vllm-sparrow supports vLLM {supported_versions_text()} only, found 0.99.0" in log
    assert "The sparrow speculative method is not registered; vLLM runs without it" in log


def test_the_start_up_check_finds_every_internal_the_v2_glue_relies_on():
    """What the plugin looks for before it registers (v2_runner/vllm_reads.py) is all on 0.34; a
    hook whose parameters are not the ones the glue overrides, or a name 0.34 lacks, is missing."""
    from vllm_sparrow.patch_helper import Read
    from vllm_sparrow.read_check import missing_reads
    from vllm_sparrow.v2_runner.vllm_reads import ROWS

    base = "vllm.v1.worker.gpu.spec_decode.speculator_config.SpeculatorConfig"
    probes = [Read(f"{base}.apply_options", "a test", "x", "signature", params=("spec_config",)),
              Read(f"{base}.no_such_hook", "a test", "x", "signature", params=("spec",)),
              Read("vllm.v1.spec_decode.eagle.EagleProposer", "a test", "x", "class")]
    missing = missing_reads(ROWS + tuple(probes))
    assert [r for r in missing if r in probes] == probes
    # Optional ones missing here: serving_layer's oneDNN GEMM ops, absent from 0.34's CPU ops module
    # (the draft's linears run on torch then), and nothing else.
    optional = [r for r in missing if r not in probes]
    assert all(not r.required and r.by == "serving_layer.py" and "onednn" in r.target for r in optional), optional
