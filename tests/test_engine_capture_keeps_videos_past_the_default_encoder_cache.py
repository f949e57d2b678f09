"""`sparrow capture --engine` keeps a video with more visual tokens than vLLM's default encoder
cache holds (4,096 on CPU: max_num_batched_tokens): the capture engine sizes it to the longest
sample it admits, so a long video is captured, not skipped with "exceeds the pre-allocated
encoder cache size" (the hard demo world's 768 s and 1,536 s draft clips were). Where the user
sets a smaller cache, the skip reason says which knob sizes it (vLLM's own message points at
--limit-mm-per-prompt, which does not)."""

import json

import pytest

from vllm_sparrow.training.capture import CaptureConfig, capture
from vllm_sparrow.training.shards import ShardReader
from sparrow_world.synthetic_clip import write_synthetic_clip


@pytest.fixture(scope="module")
def long_clip(workdir):
    root = workdir / "capture-past-encoder-cache"
    root.mkdir()
    # 112 x 112 px (the tiny target's largest frame): 4 x 4 merged patches per 2 frames;
    # 576 frames -> 288 x 16 = 4,608 tokens
    write_synthetic_clip(root / "long.mp4", 576, width=112, height=112, seed=3)
    (root / "data.jsonl").write_text(json.dumps({"video": "long.mp4", "prompt": "describe the video"}) + "\n")
    return root


def _capture(root, target_dirs, out: str, engine_args: dict):
    return capture(CaptureConfig(target=str(target_dirs("qwen2_5_vl")), data=str(root / "data.jsonl"),
                                 out=str(root / out), num_frames=576, max_new_tokens=4, max_seq_len=5000,
                                 store_dtype="float32", engine=True, engine_args=engine_args), progress=False)


def test_a_video_of_4608_visual_tokens_is_captured(long_clip, target_dirs):
    report = _capture(long_clip, target_dirs, "cap", {"dtype": "float32"})
    assert report.kept == 1 and report.skipped == {}, report
    sample = ShardReader(long_clip / "cap")[0]
    assert int(sample["is_visual"].sum()) == 4608


def test_a_cache_the_user_made_too_small_is_named_in_the_skip_reason(long_clip, target_dirs):
    report = _capture(long_clip, target_dirs, "cap-small", {"dtype": "float32", "max_num_batched_tokens": 4096})
    assert report.kept == 0 and report.skipped == {"target error": 1}, report
    (reason,) = ShardReader(long_clip / "cap-small").manifest.skipped.values()
    assert "4608 embedding tokens" in reason and "max_num_batched_tokens" in reason, reason
