"""A Sparrow server's memory stays flat under sustained load: `benchmarks/server_soak.py` starts a
real `vllm serve` of the hard world's target without speculation and with Sparrow, warms each up
and gives it two phases of mixed traffic (video chats plain and streamed, a text chat, a sampled
chat, a stream the client drops, bad requests) with 16 in flight. Over the second phase the Sparrow
server's process tree grows by at most the no-speculation server's growth plus 16 MiB, every greedy
answer is the same in every round and equal to no speculation's, and every bad request gets a 4xx
(the script exits non-zero otherwise)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SLACK_MIB = 16  # the bound over no speculation's own growth


def test_sparrow_server_grows_no_more_than_vllm_alone_over_a_second_phase(tmp_path):
    out = tmp_path / "soak"
    done = subprocess.run([sys.executable, "benchmarks/server_soak.py", "--methods", "none,sparrow", "--warmup", "2",
                           "--rounds", "12", "--phases", "2", "--max-tokens", "32", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    data = json.loads((out / "results.json").read_text())
    none, sparrow = data["growth_mib"]["none"], data["growth_mib"]["sparrow"]
    print((out / "table.md").read_text())
    assert sparrow[-1] <= none[-1] + SLACK_MIB, f"second phase: Sparrow +{sparrow[-1]:.0f} MiB, none +{none[-1]:.0f}"
    records = {r["method"]: r for r in data["records"]}
    assert records["sparrow"]["equal_to_none"]
    assert len(records["sparrow"]["answers"]) == 10  # 9 video questions and the text chat were compared
    assert records["sparrow"]["phases"][-1]["requests"] == 12 * 18
