"""benchmarks/bench_window_attention.py runs at smoke size: every path it times is checked against
the torch reference first (the packed step and the padded layout on CPU; the Triton kernel
and xformers too on a GPU), and it writes one row per step shape."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_kernel_benchmark_checks_and_times_decode_and_mixed_steps(tmp_path):
    out = tmp_path / "kernels.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_window_attention.py"), "--quick",
                           "--json", str(out)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert {r["step"] for r in rows} == {"decode", "mixed"}
    mixed = next(r for r in rows if r["step"] == "mixed")
    assert mixed["rows"] < mixed["padded_rows"] and mixed["torch_packed_ms"] > 0 and mixed["torch_padded_ms"] > 0
