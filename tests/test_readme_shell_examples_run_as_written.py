"""README's shell examples for serving and batch captioning run as written: extracted from
README.md (the indented blocks), pointed at the shipped demo models and the bundled clips (the
only edits, each placeholder asserted present, so a changed example fails here rather than for a
user), and run from another folder.

- `vllm serve ...` (with `--max-num-batched-tokens`, the flag long videos need): the server answers
  a question about the 6,144-visual-token bundled clip sent as a file:// URL from the allowed
  folder, through the `openai` client.
- `sparrow caption ...`: every bundled clip is captioned, and the terminal shows the summary
  (vLLM's own output is in the log file beside the output).
(README's offline Python example: tests/test_readme_offline_example_runs_as_written.py.)
"""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import openai
from conftest import vllm_server

ROOT = Path(__file__).resolve().parents[1]
VIDEOS = ROOT / "examples" / "videos"
PLACES = {"Qwen/Qwen2.5-VL-7B-Instruct": ROOT / "models/world/target", "TARGET": ROOT / "models/world/target",
          "path/to/sparrow-draft": ROOT / "models/world/sparrow", "DRAFT": ROOT / "models/world/sparrow",
          "/data/videos": VIDEOS, "videos/": f"{VIDEOS}/"}


def _shell_example(starts: str, places: tuple[str, ...]) -> list[str]:
    """The README's indented shell block that starts with `starts`, continuation lines joined,
    its placeholders replaced -> argv."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(rf"^    ({re.escape(starts)}.*?)(?:\n(?!    )|\Z)", readme, flags=re.M | re.S)
    assert block, f"README has no `{starts}` example"
    argv = shlex.split(block.group(1).replace("\\\n", " "))
    for place in places:
        assert place in argv or any(place in a for a in argv), (place, argv)
        argv = [str(PLACES[place]) if a == place else a.replace(place, str(PLACES[place])) for a in argv]
    return argv


def test_readmes_serve_command_answers_about_the_longest_bundled_clip(tmp_path):
    argv = _shell_example("vllm serve", ("Qwen/Qwen2.5-VL-7B-Instruct", "path/to/sparrow-draft", "/data/videos"))
    argv[0] = str(Path(sys.executable).with_name("vllm"))
    with vllm_server(None, [], tmp_path / "readme-server.log", timeout=400, command=argv) as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        reply = client.chat.completions.create(
            model=client.models.list().data[0].id, max_tokens=32, temperature=0.0,
            messages=[{"role": "user", "content": [
                {"type": "video_url", "video_url": {"url": (VIDEOS / "world_384s.mp4").as_uri()}},
                {"type": "text", "text": "describe the video ."}]}])
    assert reply.usage.prompt_tokens > 6144  # the whole clip's visual tokens went in
    assert len(reply.choices[0].message.content.split()) >= 5, reply


def test_readmes_caption_command_captions_every_bundled_clip(tmp_path):
    argv = _shell_example("sparrow caption", ("TARGET", "DRAFT", "videos/"))
    argv = [sys.executable, "-m", "vllm_sparrow.cli", *argv[1:]]  # the venv's `sparrow`
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}  # as a user runs it
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    clips = len(list(VIDEOS.glob("*.mp4")))
    assert f"{clips} captioned, 0 errors, 0 already done" in done.stdout, done.stdout[-2000:]
    assert (tmp_path / "captions.jsonl.vllm.log").stat().st_size > 0  # vLLM's output went to its log
    assert "Initializing a V1 LLM engine" not in done.stdout + done.stderr
