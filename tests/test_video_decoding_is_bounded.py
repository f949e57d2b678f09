"""PyAV decoding (offline and the server's pyav codec) is bounded: frame size, frame count and
duration are refused from the container's header before any frame is decoded, frames over the
decode area are scaled while decoding (aspect kept), and one video's decode has a time limit.
The server side (400s, the server's memory) is in test_openai_server_with_sparrow.py."""

import time

import numpy as np
import pytest

from vllm_sparrow.video import DecodeLimits, VideoDecodeError, decode_video, decode_video_bytes, write_frames


def _frames(n, width, height):
    frame = np.zeros((height, width, 3), np.uint8)
    for t in range(n):
        frame[:] = (5 * t) % 250
        yield frame


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    root = tmp_path_factory.mktemp("bounded")
    return {"wide": write_frames(root / "wide.mp4", _frames(6, 1920, 1080), fps=2),
            "long": write_frames(root / "long.mp4", _frames(400, 64, 64), fps=1)}


def test_limits_are_checked_before_any_frame_is_decoded(clips, monkeypatch):
    from vllm_sparrow import video

    def must_not_decode(*a, **kw):
        raise AssertionError("a frame was decoded")

    monkeypatch.setattr(video, "_decode_indices", must_not_decode)
    cases = {"max_frame_pixels": DecodeLimits(max_frame_pixels=1920 * 1080 - 1),
             "max_frames": DecodeLimits(max_frames=399), "max_duration_s": DecodeLimits(max_duration_s=300)}
    for name, limits in cases.items():
        path = clips["long"] if name != "max_frame_pixels" else clips["wide"]
        with pytest.raises(VideoDecodeError, match=name):
            decode_video(path, num_frames=4, limits=limits)


def test_large_frames_are_scaled_while_decoding_to_the_decode_area(clips):
    frames, meta = decode_video(clips["wide"], num_frames=3, limits=DecodeLimits(decode_pixels=480 * 270))
    assert frames.shape == (3, 270, 480, 3) and frames.flags["C_CONTIGUOUS"]
    full, _ = decode_video(clips["wide"], num_frames=3, limits=DecodeLimits(decode_pixels=0))
    assert full.shape == (3, 1080, 1920, 3)
    assert abs(float(frames.mean()) - float(full.mean())) < 2.0  # the same pictures, smaller


def test_a_decode_over_its_time_limit_stops_with_a_message(clips):
    data = clips["long"].read_bytes()
    t0 = time.monotonic()
    with pytest.raises(VideoDecodeError, match="timeout_s"):
        decode_video_bytes(data, lambda total, fps, dur: [0, total - 1], limits=DecodeLimits(timeout_s=0.0))
    assert time.monotonic() - t0 < 5
    frames, *_ = decode_video_bytes(data, lambda total, fps, dur: [0, total - 1])
    assert frames.shape[0] == 2
