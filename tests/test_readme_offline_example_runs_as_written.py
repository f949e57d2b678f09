"""README's offline Python example, pasted into a file and run as a script, works: extracted from
README.md, pointed at the shipped demo models and a bundled clip (the only edits), run in a fresh
process with vLLM's default multiprocessing (the CPU build spawns its engine core, which re-imports
the script: an unguarded example died there with "An attempt has been made to start a new process
before the current process has finished its bootstrapping phase")."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _offline_example() -> str:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    code = next(b for b in blocks if "LLM(" in b and "decode_video" in b)
    for placeholder, real in (("Qwen/Qwen2.5-VL-7B-Instruct", ROOT / "models/world/target"),
                              ("path/to/sparrow-draft", ROOT / "models/world/sparrow"),
                              ("clip.mp4", ROOT / "examples/videos/world_32s.mp4")):
        assert placeholder in code, placeholder
        code = code.replace(placeholder, str(real))
    return code


def test_readmes_offline_example_captions_a_clip_when_run_as_a_script(tmp_path):
    script = tmp_path / "caption.py"
    script.write_text(_offline_example())
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}  # vLLM's default
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    caption = done.stdout.strip().splitlines()[-1]
    assert len(caption.split()) >= 10, done.stdout[-2000:]  # the demo target describes the clip
