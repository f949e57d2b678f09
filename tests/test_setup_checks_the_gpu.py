"""On a machine whose nvidia-smi lists a GPU, setup (tools/setup_env.sh, through
tools/check_gpu_torch.py) fails unless the installed torch can use it, with a message that names
torch's CUDA version, the driver that needs and what to do; where no GPU is listed it checks
nothing. Run against a fake nvidia-smi on PATH; nothing is installed (`--check-gpu` runs the
check alone)."""

import importlib.util
import os
import subprocess
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
GPU = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-1111-2222-3333-444444444444)"


def _check_module():
    spec = importlib.util.spec_from_file_location("check_gpu_torch", ROOT / "tools" / "check_gpu_torch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check = _check_module()


def _facts(**kw):
    facts = dict(gpus=[GPU], driver="550.54.15", driver_cuda="12.4", torch_version="2.13.0+cu130",
                 torch_cuda="13.0", cuda_available=False, cuda_error=None, pinned="2.13.0")
    return {**facts, **kw}


def test_a_cuda_13_torch_on_an_older_driver_names_both_and_the_driver_it_needs():
    message = check.diagnose(**_facts(cuda_error="RuntimeError: The NVIDIA driver on your system is too old"))
    assert "torch 2.13.0+cu130 is built for CUDA 13.0" in message
    assert "needs an NVIDIA driver >= 580" in message and "driver 550.54.15 (supports CUDA up to 12.4)" in message
    assert "upgrade the NVIDIA driver to 580 or newer" in message and "SPARROW_DEVICE=cpu" in message
    assert "driver on your system is too old" in message  # torch's own reason rides along


def test_a_new_enough_driver_points_at_visibility_not_at_the_driver():
    message = check.diagnose(**_facts(driver="580.65.06", driver_cuda="13.0"))
    assert "driver is new enough" in message and "CUDA_VISIBLE_DEVICES" in message
    assert "upgrade the NVIDIA driver" not in message


def test_a_cpu_torch_on_a_gpu_machine_is_named_as_such():
    message = check.diagnose(**_facts(torch_version="2.13.0+cpu", torch_cuda=None))
    assert "CPU-only build" in message and "torch.version.cuda is None" in message


def test_a_torch_other_than_vllms_pin_is_refused_even_when_it_sees_the_gpu():
    message = check.diagnose(**_facts(torch_version="2.14.0+cu130", cuda_available=True))
    assert "vllm requires torch==2.13.0" in message


def test_nothing_is_wrong_when_torch_sees_the_gpu_or_no_gpu_is_listed():
    assert check.diagnose(**_facts(cuda_available=True, driver="580.65.06")) is None
    assert check.diagnose(**_facts(gpus=[], torch_cuda=None, torch_version="2.13.0+cpu")) is None


def _fake_nvidia_smi(bin_dir: Path, gpus: bool) -> None:
    """nvidia-smi answering -L, the driver-version query and its banner, as a real one does."""
    bin_dir.mkdir()
    script = bin_dir / "nvidia-smi"
    if gpus:
        script.write_text(f"""#!/usr/bin/env bash
case "$1" in
    -L) echo "{GPU}" ;;
    --query-gpu=driver_version) echo "550.54.15" ;;
    *) echo "| NVIDIA-SMI 550.54.15    Driver Version: 550.54.15    CUDA Version: 12.4 |" ;;
esac
""")
    else:
        script.write_text('#!/usr/bin/env bash\necho "No devices were found"\nexit 6\n')
    script.chmod(0o755)


def _setup_check(tmp_path, gpus: bool) -> subprocess.CompletedProcess:
    _fake_nvidia_smi(tmp_path / "bin", gpus)
    env = {k: v for k, v in os.environ.items() if k != "SPARROW_DEVICE"}
    env["PATH"] = f"{tmp_path / 'bin'}:{env['PATH']}"
    env["CUDA_VISIBLE_DEVICES"] = ""  # on a real GPU machine too, torch sees no GPU in this run
    return subprocess.run(["bash", str(ROOT / "tools" / "setup_env.sh"), "--check-gpu"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(not (ROOT / ".venv" / "bin" / "python").exists(), reason="needs the project's .venv (make setup)")
def test_setup_fails_when_nvidia_smi_lists_a_gpu_that_torch_cannot_use(tmp_path):
    done = _setup_check(tmp_path, gpus=True)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "GPU check failed" in done.stderr and "nvidia-smi lists 1 GPU(s) (GPU 0: NVIDIA H100" in done.stderr
    if torch.version.cuda is None:  # this machine's venv: the CPU build
        assert "CPU-only build" in done.stderr, done.stderr
    else:
        assert f"built for CUDA {torch.version.cuda}" in done.stderr and "driver 550.54.15" in done.stderr, done.stderr


@pytest.mark.skipif(not (ROOT / ".venv" / "bin" / "python").exists(), reason="needs the project's .venv (make setup)")
def test_setup_checks_nothing_where_nvidia_smi_lists_no_gpu(tmp_path):
    done = _setup_check(tmp_path, gpus=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "set up for the CPU: no GPU to check" in done.stderr
