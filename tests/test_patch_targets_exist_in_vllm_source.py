"""Every vLLM internal the plugin declares (its glue's table: glues.table_for) and every vLLM import
of the product is where it says in the source of each release of vllm_sparrow/releases.py, read
with ast and never imported (tools/vllm_source_check.py): the installed vLLM where it is the
release, else the GPU wheel its row names, downloaded without dependencies into .cache/vllm-wheels/
(gitignored; kept between runs), since this machine's CPU build stays 0.32.0. The source check agrees with the start-up check on the installed vLLM, and it
fails on a tree that lacks a target. With vLLM's version reading 0.33.0 the plugin registers
sparrow; on an unsupported one it steps aside naming the supported versions."""

import email
import importlib.util
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from vllm_sparrow import patches, read_check
from vllm_sparrow.patch_helper import Read
from vllm_sparrow.releases import V2, release, versions, wheel_version
from vllm_sparrow.v2_runner import vllm_reads as v2_reads

ROOT = Path(__file__).resolve().parents[1]


def _tool(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


check = _tool("vllm_source_check")
INSTALLED = check.SourceTree(check.installed_source())


@pytest.fixture(scope="module")
def wheel_033() -> Path:
    return check.wheel_for("0.33.0")  # ~5 s from the registry the first time, then the cached file


@pytest.fixture(scope="module")
def wheel_034() -> Path:
    return check.wheel_for("0.34.0")


def _missing(results) -> list[str]:
    return [r.line() for r in results if r.status == "MISSING"]


@pytest.mark.parametrize("version", versions())
def test_every_declared_row_and_product_import_is_in_the_release_source(version):
    """Each release of releases.py against its own glue's table and imports (glues.table_for,
    glue_of): the V1 runner's patch table on its releases, the V2 runner's reads on its own, the
    shared modules on all."""
    tree = check.SourceTree(check.release_source(version))
    assert tree.version() == wheel_version(release(version))
    rows, imports = check.check_rows(tree, version), check.check_imports(tree, check.imports_for(version))
    assert _missing(rows + imports) == []
    if release(version).runner == V2:
        assert {r.target for r in rows} == {r.target for r in v2_reads.ROWS}
        assert any("v2_runner/method.py" in r.by for r in imports)
        assert not any("proposer.py" in r.by or "method_patches.py" in r.by for r in imports)
        return
    assert not any("v2_runner/" in r.by for r in imports)
    checked = [r for r in patches.PATCHES if not (r.kind == "reads" and r.check == "documented")]
    assert sum(r.status == "found" for r in rows) == len(checked)  # the cpu rows too: both ship their source
    assert len(imports) > 20 and any("from vllm import ModelRegistry" in r.target for r in imports)


def test_the_source_check_agrees_with_the_start_up_check_on_the_installed_vllm():
    """The same targets the start-up check finds or misses on the installed objects (present,
    renamed, a property asked for as a field, a moved module) are found or missed in source."""
    batch, eagle = "vllm.v1.worker.gpu_input_batch.InputBatch", "vllm.v1.spec_decode.eagle.EagleProposer"
    probes = [Read(f"{batch}.renamed_array", "a test", "x", "instance"),
              Read(f"{batch}.req_ids", "a test", "x", "field"),
              Read("vllm.v1.attention.backend.CommonAttentionMetadata.renamed_field", "a test", "x", "field"),
              Read(f"{eagle}.renamed_method", "a test", "x", "class"),
              Read(f"{eagle}.load_model", "a test", "x", "instance"),  # a method, assigned nowhere
              Read("vllm.v1.moved_module.Class.attr", "a test", "x", "class"),
              Read("vllm.ModelRegistry.renamed", "a test", "x", "class"),
              Read(f"{batch}.token_ids_cpu", "a test", "x", "instance"),
              Read("vllm.v1.sample.metadata.SamplingMetadata.all_greedy", "a test", "x", "field"),
              Read("vllm.ModelRegistry.register_model", "a test", "x", "class"),
              Read("vllm.platforms.current_platform", "a test", "x", "class")]
    reads = [r for r in patches.PATCHES if r.kind == "reads" and read_check.on_this_platform(r)]
    rows = probes + reads
    runtime_missing = read_check.missing_reads(rows)
    source_missing = [row for row, r in zip(rows, check.check_rows(INSTALLED, "0.32.0", rows))
                      if r.status == "MISSING"]
    assert source_missing == runtime_missing == probes[:7]


def test_a_target_missing_from_the_source_is_reported(wheel_033, tmp_path):
    """0.33's source with a method renamed, an instance attribute renamed, a lazy export and a
    module removed: exactly the rows and imports that name them are missing, and the command fails."""
    with zipfile.ZipFile(wheel_033) as wheel:
        wheel.extractall(tmp_path, [n for n in wheel.namelist() if n.startswith("vllm/") and n.endswith(".py")])
    vllm = tmp_path / "vllm"
    _edit(vllm / "v1/worker/gpu_model_runner.py", "def _update_states(", "def _update_batch_states(")
    _edit(vllm / "v1/worker/gpu_input_batch.py", "self.token_ids_cpu = ", "self.host_token_ids = ")
    _edit(vllm / "__init__.py", '"ModelRegistry": ', '"ModelRegistryMoved": ')
    (vllm / "multimodal/media/connector.py").unlink()
    tree = check.SourceTree(tmp_path)
    assert tree.build() == "cuda" and tree.version() == "0.33.0"
    missing = {r.target for r in check.check_all(tree) if r.status == "MISSING"}
    assert missing == {
        "vllm.v1.worker.gpu_model_runner.GPUModelRunner._update_states",
        "vllm.v1.worker.gpu_input_batch.InputBatch.token_ids_cpu",
        "vllm.ModelRegistry.models['SparrowDraftModel']",
        "from vllm import ModelRegistry",
        "vllm.multimodal.media.connector.MediaConnector._load_file_url",
        "vllm.multimodal.media.connector.MediaConnector.allowed_local_media_path",
        "from vllm.multimodal.media.connector import MediaConnector",
    }
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "vllm_source_check.py"), "--source", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "MISSING  replaces vllm.v1.worker.gpu_model_runner.GPUModelRunner._update_states" in done.stdout
    assert "7 missing" in done.stdout.splitlines()[-1]


def test_a_hook_of_the_v2_runner_renamed_or_removed_fails_the_source_check(wheel_034, tmp_path):
    """0.34's source with an argument of a hook the V2 glue overrides renamed, and the registry's
    function removed: exactly those rows and the import of the function are missing."""
    with zipfile.ZipFile(wheel_034) as wheel:
        wheel.extractall(tmp_path, [n for n in wheel.namelist() if n.startswith("vllm/") and n.endswith(".py")])
    configs = tmp_path / "vllm/v1/worker/gpu/spec_decode/speculator_config.py"
    _edit(configs, '    def apply_options(cls, spec: "SpeculativeConfig") -> None:',
          '    def apply_options(cls, spec_config: "SpeculativeConfig") -> None:')
    _edit(configs, "def register_speculative_method(", "def register_custom_speculator(")
    tree = check.SourceTree(tmp_path)
    assert tree.version() == "0.34.0"
    missing = {r.target: r.detail for r in check.check_all(tree) if r.status == "MISSING"}
    base = "vllm.v1.worker.gpu.spec_decode.speculator_config"
    assert missing == {
        f"{base}.SpeculatorConfig.apply_options": "its parameters are (spec_config)",
        f"{base}.register_speculative_method": f"no method register_speculative_method in {base}",
        f"from {base} import register_speculative_method": f"{base} has no register_speculative_method",
    }


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, (path, old)
    path.write_text(text.replace(old, new))


def test_a_row_made_for_one_version_is_checked_on_that_version_only():
    """A row declared for one supported version (a target that moved) is skipped on the other, by
    the source check as by apply_patches (patch_helper.for_version)."""
    moved = Read("vllm.v1.kv_cache_interface.no_such_name", "a test", "x", "class", vllm_versions=("0.33.0",))
    on_032, = check.check_rows(INSTALLED, "0.32.0", [moved])
    on_033, = check.check_rows(INSTALLED, "0.33.0", [moved])
    assert on_032.status == "skipped" and "vLLM 0.33.0 only" in on_032.detail
    assert on_033.status == "MISSING"


def test_the_gpu_setup_check_reads_the_torch_pin_of_either_release(wheel_033):
    """tools/check_gpu_torch.py compares the installed torch with vllm's exact pin: 2.14.0 for 0.33."""
    with zipfile.ZipFile(wheel_033) as wheel:
        metadata = email.message_from_bytes(wheel.read("vllm-0.33.0.dist-info/METADATA"))
    gpu_check = _tool("check_gpu_torch")
    assert gpu_check.torch_pin(metadata.get_all("Requires-Dist")) == "2.14.0"
    assert gpu_check.torch_pin(["torch==2.13.0", "xformers; extra == 'bench'"]) == "2.13.0"  # 0.32's GPU wheel


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=dict(os.environ), capture_output=True,
                          text=True, timeout=600)


def test_the_plugin_registers_on_another_supported_version(tmp_path):
    """In a fresh process (the patches stay for the process): vLLM reading 0.33.0, then the
    plugin's entry point; "sparrow" reaches the plugin's draft validation, past vLLM's method
    check. (An unsupported version, where the plugin steps aside and vLLM refuses the method:
    test_plugin_never_stops_vllm.py.)"""
    done = _run(f"""
        import vllm
        vllm.__version__ = "0.33.0"
        from vllm_sparrow import patches
        print("APPLIED_BEFORE", len(patches.APPLIED))
        from vllm_sparrow.plugin import register
        register()
        print("APPLIED", len(patches.APPLIED))
        from vllm.config import SpeculativeConfig
        try:
            SpeculativeConfig(method="sparrow", model={str(tmp_path / "no-draft")!r}, num_speculative_tokens=3)
        except Exception as e:
            print("RAISED", str(e).replace("\\n", " "))
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "APPLIED_BEFORE 0" in done.stdout
    here = [r for r in patches.PATCHES if r.kind == "replaces" and read_check.on_this_platform(r)]
    assert f"APPLIED {len(here)}" in done.stdout
    assert "no-draft' does not exist" in done.stdout  # past vLLM's method check, into the plugin's


def test_downloaded_wheels_stay_out_of_the_repository(wheel_033):
    assert wheel_033.parent == ROOT / ".cache" / "vllm-wheels"
    ignored = subprocess.run(["git", "check-ignore", "-q", str(wheel_033)], cwd=ROOT)
    assert ignored.returncode == 0, "add .cache/vllm-wheels/ to .gitignore"
