"""benchmarks/confidence_calibration.py (which confidence predicts Sparrow's acceptance, for vLLM
0.34's adaptive verification) runs on the shipped hard world and scores all three confidences on
the positions its verifier reached."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_calibration_benchmark_scores_every_confidence():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "confidence_calibration.py"), "--max-new-tokens",
                           "48"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    positions = int(re.search(r"(\d+) verified positions", done.stdout).group(1))
    assert positions > 20, done.stdout
    scored = re.findall(r"log-loss (\d\.\d+)  Brier (\d\.\d+)", done.stdout)
    assert len(scored) == 3 and all(0 < float(a) < 2 and 0 < float(b) < 1 for a, b in scored), done.stdout
