"""vLLM decodes video URLs with PyAV when asked (`media_io_kwargs={"video": {"backend": "pyav"}}`,
patch pyav-video-codec; also the default when opencv cannot load): the same frames and output as the offline decoder, and a clear error
for a file that is not a video."""

import base64

import pytest
from conftest import close_llm, make_llm
from vllm import SamplingParams

from sparrow_world.tiny_targets import make_prompt
from vllm_sparrow.video import VideoDecodeError
from sparrow_world.synthetic_clip import write_synthetic_clip

KIND = "qwen2_5_vl"
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def _chat(url, text="describe the video"):
    return [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": url}},
                                         {"type": "text", "text": text}]}]


def _data_url(raw: bytes) -> str:
    return "data:video/mp4;base64," + base64.b64encode(raw).decode()


@pytest.fixture(scope="module", autouse=True)
def plugin():
    from vllm_sparrow.plugin import register

    register()  # what vLLM does at engine start; the codec tests below run without one


@pytest.fixture(scope="module")
def llm(target_dirs):
    engine = make_llm(target_dirs(KIND), media_io_kwargs={"video": {"backend": "pyav", "num_frames": 8}})
    yield engine
    close_llm(engine)


@pytest.mark.parametrize("loader", ["opencv", "qwen2_vl"])
def test_pyav_picks_the_same_frames_as_vllms_opencv_codec(loader, tmp_path):
    import numpy as np
    from vllm.multimodal.video import VIDEO_LOADER_REGISTRY

    raw = write_synthetic_clip(tmp_path / "clip.mp4", 24, seed=4).read_bytes()
    cls = VIDEO_LOADER_REGISTRY.name2class[loader]
    ours, ours_meta = cls.load_bytes(raw, num_frames=8, backend="pyav")
    ref, ref_meta = cls.load_bytes(raw, num_frames=8, backend="opencv")
    assert ours.shape == ref.shape
    assert {k: v for k, v in ours_meta.items() if k != "video_backend"} == \
        {k: v for k, v in ref_meta.items() if k != "video_backend"}
    assert np.abs(ours.astype(int) - ref.astype(int)).mean() < 3  # colour conversion rounding


def test_default_codec_falls_back_to_pyav_when_opencv_cannot_load(tmp_path, monkeypatch):
    import sys

    import numpy as np
    from vllm.multimodal.video import VIDEO_LOADER_REGISTRY

    raw = write_synthetic_clip(tmp_path / "clip.mp4", 24, seed=4).read_bytes()
    cls = VIDEO_LOADER_REGISTRY.name2class["opencv"]
    ref, _ = cls.load_bytes(raw, num_frames=8, backend="pyav")
    monkeypatch.setitem(sys.modules, "cv2", None)  # `import cv2` now raises ImportError
    frames, meta = cls.load_bytes(raw, num_frames=8)  # vLLM's default codec: opencv
    assert np.array_equal(frames, ref) and len(meta["frames_indices"]) == 8


def test_data_url_video_is_served_with_the_pyav_frames(llm, target_dirs, tmp_path):
    from vllm.multimodal.video import VIDEO_LOADER_REGISTRY

    raw = write_synthetic_clip(tmp_path / "clip.mp4", 24, seed=4).read_bytes()
    served = llm.chat(_chat(_data_url(raw)), GREEDY)[0]
    # Qwen2.5-VL's video loader in vLLM is "qwen2_vl" (Qwen's own frame rule)
    frames, meta = VIDEO_LOADER_REGISTRY.name2class["qwen2_vl"].load_bytes(raw, num_frames=8, backend="pyav")
    offline = llm.generate({"prompt": make_prompt(KIND, target_dirs(KIND), "describe the video", "video"),
                            "multi_modal_data": {"video": (frames, meta)}}, GREEDY)[0]
    assert served.prompt_token_ids == offline.prompt_token_ids
    assert list(served.outputs[0].token_ids) == list(offline.outputs[0].token_ids)


def test_a_file_that_is_not_a_video_gets_a_clear_error(llm):
    with pytest.raises(VideoDecodeError, match="cannot decode as video.*re-encode"):
        llm.chat(_chat(_data_url(b"definitely not an mp4" * 50)), GREEDY)
    assert llm.chat([{"role": "user", "content": "still serving"}], GREEDY)[0].outputs[0].token_ids
