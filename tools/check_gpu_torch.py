"""Checks, after setup installed the GPU requirements, that the installed torch can use the GPU
that nvidia-smi lists, and that it is the torch vLLM pins (tools/setup_env.sh runs this on the
GPU path; `bash tools/setup_env.sh --check-gpu` runs only this).

    .venv/bin/python tools/check_gpu_torch.py

Exit 0 when nvidia-smi is absent or lists no GPU (nothing to check) or when torch sees the GPU;
exit 1 with what is wrong and what to do otherwise. Without this, a torch built for a newer CUDA
than the driver supports installs fine and every engine then falls back to, or fails on, a
machine "without" a GPU, far from the cause.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

# Lowest Linux driver branch that runs each CUDA major version's runtime (NVIDIA's minor-version
# compatibility: any 13.x runtime on >= 580, any 12.x on >= 525, any 11.x on >= 450). torch's
# wheels carry their own CUDA runtime, so the driver is the only part the machine must supply.
MIN_DRIVER = {13: 580, 12: 525, 11: 450}


def nvidia_smi() -> tuple[list[str], str | None, str | None]:
    """(GPU lines of `nvidia-smi -L`, driver version, the highest CUDA version the driver supports);
    ([], None, None) without a working nvidia-smi."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return [], None, None

    def run(*args: str) -> str:
        try:
            return subprocess.run([exe, *args], capture_output=True, text=True, timeout=60).stdout
        except (OSError, subprocess.TimeoutExpired):
            return ""

    gpus = [line for line in run("-L").splitlines() if line.startswith("GPU ")]
    if not gpus:
        return [], None, None
    driver = (run("--query-gpu=driver_version", "--format=csv,noheader").splitlines() or [""])[0].strip() or None
    cuda = re.search(r"CUDA Version:\s*([0-9.]+)", run())  # the banner of plain `nvidia-smi`
    return gpus, driver, cuda.group(1) if cuda else None


def vllm_torch_pin() -> str | None:
    """The torch version the installed vllm requires exactly (torch==X), if any: torch 2.13.0 for
    vllm 0.32.0, torch 2.14.0 for vllm 0.33.0 (read from the installed metadata, so either)."""
    import importlib.metadata as md

    try:
        requires = md.requires("vllm") or []
    except md.PackageNotFoundError:
        return None
    return torch_pin(requires)


def torch_pin(requires: list[str]) -> str | None:
    """The exact torch pin among a distribution's Requires-Dist lines, if any."""
    for req in requires:
        if ";" in req:  # an extra's or a platform's requirement, not the one installed with vllm
            continue
        found = re.fullmatch(r"torch\s*==\s*([^\s,]+)", req.strip())
        if found:
            return found.group(1)
    return None


def diagnose(*, gpus: list[str], driver: str | None, driver_cuda: str | None, torch_version: str,
             torch_cuda: str | None, cuda_available: bool, cuda_error: str | None,
             pinned: str | None) -> str | None:
    """What is wrong, as the message to print, or None when nothing is."""
    if not gpus:
        return None
    listed = f"nvidia-smi lists {len(gpus)} GPU(s) ({gpus[0]}{', ...' if len(gpus) > 1 else ''})"
    if pinned is not None and torch_version.split("+")[0] != pinned.split("+")[0]:
        return (f"torch {torch_version} is installed, but vllm requires torch=={pinned}: something installed "
                "after vllm replaced its torch (a package installed without --no-deps or with another torch pin). "
                "Reinstall with `SPARROW_FORCE_SETUP=1 make setup`.")
    if cuda_available:
        return None
    if torch_cuda is None:
        return (f"{listed}, but the installed torch {torch_version} is a CPU-only build (torch.version.cuda is "
                "None). Reinstall the GPU requirements (`SPARROW_FORCE_SETUP=1 make setup`), or set "
                "SPARROW_DEVICE=cpu to set up for the CPU on purpose.")
    major = int(torch_cuda.split(".")[0])
    need = MIN_DRIVER.get(major)
    need_text = f"an NVIDIA driver >= {need}" if need else f"an NVIDIA driver that supports CUDA {torch_cuda}"
    head = (f"{listed}, but torch.cuda.is_available() is False. The installed torch {torch_version} is built "
            f"for CUDA {torch_cuda}, which needs {need_text}; nvidia-smi reports driver {driver or 'unknown'}"
            + (f" (supports CUDA up to {driver_cuda})" if driver_cuda else "") + ".")
    if cuda_error:
        head += f" torch says: {cuda_error.strip().splitlines()[-1]}"
    driver_major = int(driver.split(".")[0]) if driver and driver.split(".")[0].isdigit() else None
    if need is not None and driver_major is not None and driver_major < need:
        return (head + f"\nWhat to do: upgrade the NVIDIA driver to {need} or newer (then reboot or reload the "
                "kernel module) and rerun `make setup`; or install vLLM's and torch's builds for a CUDA version "
                "this driver supports (see vLLM's GPU installation guide) in place of tools/requirements-gpu.txt's "
                "default ones; or set SPARROW_DEVICE=cpu to set up for the CPU.")
    return (head + "\nThe driver is new enough, so torch cannot reach the GPU for another reason: check "
            "CUDA_VISIBLE_DEVICES, that this user can open /dev/nvidia* (in a container: started with GPU "
            "access, e.g. --gpus all), and that `nvidia-smi` shows no error; then rerun `make setup`.")


def main() -> int:
    gpus, driver, driver_cuda = nvidia_smi()
    if not gpus:
        print("[setup_env] no NVIDIA GPU listed by nvidia-smi: nothing to check")
        return 0
    import torch

    cuda_available, cuda_error = torch.cuda.is_available(), None
    if not cuda_available and torch.version.cuda is not None:
        try:
            torch.cuda.init()  # raises the reason is_available() keeps to itself
        except Exception as e:  # noqa: BLE001 - any reason is worth showing
            cuda_error = f"{type(e).__name__}: {e}"
    problem = diagnose(gpus=gpus, driver=driver, driver_cuda=driver_cuda, torch_version=torch.__version__,
                       torch_cuda=torch.version.cuda, cuda_available=cuda_available, cuda_error=cuda_error,
                       pinned=vllm_torch_pin())
    if problem:
        print(f"[setup_env] the GPU setup is not usable: {problem}", file=sys.stderr)
        return 1
    print(f"[setup_env] ok: torch {torch.__version__} (CUDA {torch.version.cuda}) sees "
          f"{torch.cuda.device_count()} GPU(s), {torch.cuda.get_device_name(0)}; driver {driver}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
