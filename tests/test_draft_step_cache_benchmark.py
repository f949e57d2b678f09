"""benchmarks/draft_step_cache.py runs at smoke size: it streams the target's KV bytes at each
length (layers x K and V x kv heads x head_dim x float32 x tokens) between draft steps of the
serving drafter and times the draft step with and without that stream."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_draft_step_is_timed_alone_and_after_the_targets_kv_bytes_at_each_length(tmp_path):
    out = tmp_path / "dsc"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "draft_step_cache.py"), "--quick",
                           "--lengths", "512,24960", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    result = json.loads((out / "results.json").read_text())
    text = json.loads((ROOT / "models/world-hard/target/config.json").read_text())
    text = text.get("text_config", text)
    head_dim = text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
    per_token = text["num_hidden_layers"] * 2 * text["num_key_value_heads"] * head_dim * 4
    records = result["records"]
    assert [r["visual_tokens"] for r in records] == [512, 24960]
    for r in records:
        assert abs(r["streamed_mb"] - r["visual_tokens"] * per_token / 1e6) < 1e-9
        assert len(r["alone_ms"]) == len(r["after_stream_ms"]) == 1 and r["alone_median_ms"] > 0
        assert abs(r["ratio"] - r["after_stream_median_ms"] / r["alone_median_ms"]) < 1e-12
    assert (out / "table.md").read_text().count("\n") == 2 + len(records)
