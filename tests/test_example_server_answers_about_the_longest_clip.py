"""examples/serve_sparrow.sh and examples/ask_video.py, run as README says, answer a question about
the longest bundled clip (world_384s.mp4, 6,144 visual tokens) with Sparrow drafting.

The script is sized for long videos: before, vLLM refused that clip ("exceeds the pre-allocated
encoder cache size 2048"), because its encoder cache is sized from --max-num-batched-tokens. The
script's flags pass through (the port here), and the server's spec-decode counter (/metrics) shows
the draft was accepted.
"""

import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

from conftest import DEMO_MODELS, vllm_server

ROOT = Path(__file__).resolve().parents[1]


def test_the_example_server_answers_about_the_6144_token_clip(tmp_path):
    models = Path(DEMO_MODELS)
    script = ["bash", str(ROOT / "examples" / "serve_sparrow.sh"), str(models / "target"), str(models / "sparrow"),
              str(ROOT / "examples" / "videos")]
    env = {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}  # the venv's vllm, as when activated
    log = tmp_path / "example-server.log"
    with vllm_server(None, [], log, env, timeout=400, command=script) as (url, _):
        asked = subprocess.run([sys.executable, str(ROOT / "examples" / "ask_video.py"),
                                str(ROOT / "examples" / "videos" / "world_384s.mp4"), "describe the video .",
                                "--url", url, "--max-tokens", "48"], capture_output=True, text=True, timeout=600)
        # the server's Prometheus counter, read at once (its log prints the same every 10 s)
        with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
            metrics = r.read().decode()
    assert asked.returncode == 0, asked.stdout[-2000:] + asked.stderr[-3000:]
    answer = asked.stdout.strip()
    assert len(answer.split()) >= 8, answer  # the demo target captions the clip
    accepted = re.findall(r"^vllm:spec_decode_num_accepted_tokens_total\{[^}]*\} ([\d.e+]+)$", metrics, re.M)
    assert accepted and float(accepted[0]) > 0, metrics[-3000:]  # Sparrow drafted, and was accepted
