"""Video helpers on PyAV: a frame writer and a uniform-sampling decoder (the synthetic test clip is
the demo kit's: sparrow_world/synthetic_clip.py).

``decode_video`` returns ``(frames, metadata)`` in the form vLLM 0.32 takes offline::

    frames, meta = decode_video("clip.mp4", num_frames=8)   # frames: (T, H, W, 3) uint8 RGB
    llm.generate({"prompt": prompt, "multi_modal_data": {"video": (frames, meta)}})

The metadata keys are the ones vLLM's own video loader produces (``create_hf_metadata``) and
Qwen2.5-VL / Qwen3-VL require: ``total_num_frames``, ``fps``, ``duration``, ``video_backend``,
``frames_indices``, ``do_sample_frames``. vLLM turns all but ``do_sample_frames`` into a
``transformers.VideoMetadata``, so no other key may be added.

Decoding is bounded (``DecodeLimits``): the container's frame size, frame count and duration are
checked before any frame is decoded, only the sampled frames are converted, into one array
allocated once, frames over ``decode_pixels`` are scaled down while decoding (to a size above
what Qwen-VL and LLaVA-OneVision processors keep per frame), and one video's decode has a wall
clock limit. Over a limit -> ``VideoDecodeError`` naming it (a 400 on the server).
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Iterable

import numpy as np

__all__ = ["DecodeLimits", "VideoDecodeError", "decode_video", "decode_video_bytes", "sample_frame_indices",
           "write_frames"]


class VideoDecodeError(ValueError):
    """A file could not be read as a video; the message names the file and a next step."""


@dataclass(frozen=True)
class DecodeLimits:
    """What one video may cost to decode (server: the pyav backend's options in
    `--media-io-kwargs '{"video": {"backend": "pyav", "timeout_s": 60, ...}}'`)."""

    max_frame_pixels: int | None = None  # width x height; None: vLLM's VLLM_MAX_IMAGE_PIXELS
    max_frames: int = 1_000_000  # frames in the stream (over 9 hours at 30 fps)
    max_duration_s: float = 4 * 3600.0
    timeout_s: float = 120.0  # wall clock for decoding one video
    decode_pixels: int = 1 << 20  # larger frames are scaled down to this area while decoding

    def frame_pixel_limit(self) -> int:
        if self.max_frame_pixels is not None:
            return self.max_frame_pixels
        return int(os.environ.get("VLLM_MAX_IMAGE_PIXELS", "178956970"))

    def check(self, name: Any, width: int, height: int, total: int, duration: float) -> None:
        """Refuse, before decoding, a video over a limit (the message names the limit)."""
        pixels = self.frame_pixel_limit()
        if pixels > 0 and width * height > pixels:
            raise VideoDecodeError(f"{name}: frames of {width}x{height} exceed the limit of {pixels} pixels "
                                   "(VLLM_MAX_IMAGE_PIXELS / max_frame_pixels); send a smaller video")
        if total > self.max_frames:
            raise VideoDecodeError(f"{name}: {total} frames exceed the limit of {self.max_frames} (max_frames); "
                                   "send a shorter video")
        if duration > self.max_duration_s:
            raise VideoDecodeError(f"{name}: {duration:.0f} s exceeds the limit of {self.max_duration_s:g} s "
                                   "(max_duration_s); send a shorter video")

    def output_size(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) frames are decoded to: the source's, or scaled down (aspect kept,
        even sides) to at most decode_pixels."""
        if self.decode_pixels <= 0 or width * height <= self.decode_pixels:
            return width, height
        scale = (self.decode_pixels / (width * height)) ** 0.5
        return max(2, int(width * scale) // 2 * 2), max(2, int(height * scale) // 2 * 2)


def write_frames(path: str | Path, frames: Iterable[np.ndarray], fps: float) -> Path:
    """Encode RGB frames (an array [T, H, W, 3] uint8, or any iterable of [H, W, 3] frames, so
    long clips can be streamed) as a near-lossless H.264 mp4 at ``fps``."""
    import av

    frames = iter(frames)
    first = next(frames, None)
    if first is None:
        raise ValueError("no frames to write")
    height, width = first.shape[:2]
    if width % 2 or height % 2:  # yuv420p halves chroma resolution: odd sizes are rejected
        raise ValueError(f"width and height must be even for yuv420p, got {width}x{height}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("libx264", rate=Fraction(fps).limit_denominator(1001))
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        # crf 10: near-lossless, so decoded frames stay close to the drawn ones. The file must be a
        # function of the frames, or the benchmark's clips (and the target's captions of them) vary
        # between runs: explicit pts, one encoder thread, and no macroblock-tree rate control
        # (x264's mbtree gave another file for the same frames now and then within one process,
        # decoded pixels up to 12 levels apart; seen in 1 of 3 to 1 of 20 writes, none without it).
        stream.options = {"crf": "10", "preset": "veryfast", "threads": "1", "x264-params": "mbtree=0"}
        for i, rgb in enumerate(itertools.chain([first], frames)):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
            frame.pts = i
            container.mux(stream.encode(frame))
        container.mux(stream.encode())  # flush the encoder's delayed frames
    return path


def sample_frame_indices(
    total_num_frames: int,
    duration: float,
    num_frames: int | None = None,
    fps: float | None = None,
) -> list[int]:
    """Uniform frame indices, exactly as vLLM's default ``opencv`` video loader picks them.

    The smallest of ``total_num_frames``, ``num_frames`` and ``floor(duration * fps)`` wins
    (at least 1); if that is every frame, all indices are kept in order.
    """
    count = total_num_frames
    if num_frames is not None and num_frames > 0:
        count = min(count, num_frames)
    if fps is not None and fps > 0:
        count = min(count, int(np.floor(duration * fps)))
    count = max(1, count)
    if count == total_num_frames:
        return list(range(total_num_frames))
    return np.linspace(0, total_num_frames - 1, count, dtype=int).tolist()


def decode_video(
    path: str | Path,
    num_frames: int | None = None,
    fps: float | None = None,
    limits: DecodeLimits = DecodeLimits(),
) -> tuple[np.ndarray, dict[str, Any]]:
    """Decode uniformly sampled RGB frames and the metadata vLLM's Qwen-VL processors need.

    ``num_frames`` caps the frame count, ``fps`` caps the sampling rate (both optional; with
    neither, every frame is returned). Returns ``frames`` of shape (T, H, W, 3) uint8 and
    ``metadata`` (see the module docstring). Raises ``VideoDecodeError`` for a missing,
    empty, corrupt or non-video file.
    """
    path = Path(path)
    if not path.is_file():
        raise VideoDecodeError(f"{path}: no such file (or not a file); check the path")
    total, src_fps, duration = _guarded(path, _probe, limits)
    wanted = sample_frame_indices(total, duration, num_frames, fps)
    frames, kept, seen = _guarded(path, _decode_indices, wanted, limits)
    if len(kept) < len(wanted) and seen > 0:
        # The (estimated) frame count overshot the real one: resample over the real count.
        total = seen
        wanted = sample_frame_indices(total, duration, num_frames, fps)
        frames, kept, seen = _guarded(path, _decode_indices, wanted, limits)

    if not kept:
        raise VideoDecodeError(f"{path}: the video stream has no decodable frame; re-encode it")
    metadata = {
        "total_num_frames": total,
        "fps": src_fps,  # the source rate: HF derives timestamps as index / fps
        "duration": duration,
        "video_backend": "pyav",
        "frames_indices": kept,  # source index of each returned frame
        # The frames are already sampled: tell the HF processors not to resample them
        # (Qwen3-VL would otherwise re-pick frames at its own 2 fps).
        "do_sample_frames": False,
    }
    return frames, metadata


def decode_video_bytes(
    data: bytes, pick: Any, name: str = "the video", limits: DecodeLimits = DecodeLimits(),
) -> tuple[np.ndarray, tuple[int, float, float], list[int], list[int]]:
    """Decode an in-memory video: ``pick(total, fps, duration) -> wanted frame indices``.

    Returns (frames (T, H, W, 3) uint8, (total, fps, duration), wanted, decoded indices);
    errors are ``VideoDecodeError`` with ``name`` in the message. vLLM's pyav codec
    (v1_runner/vllm_fixes.py) uses this for video URLs and data: URLs.
    """
    import io

    def opened():
        return io.BytesIO(data)

    total, src_fps, duration = _guarded(name, _probe, limits, source=opened())
    wanted = list(pick(total, src_fps, duration))
    frames, kept, seen = _guarded(name, _decode_indices, wanted, limits, source=opened())
    if len(kept) < len(wanted) and seen > 0:  # the header's frame count overshot
        total = seen
        wanted = list(pick(total, src_fps, duration))
        frames, kept, seen = _guarded(name, _decode_indices, wanted, limits, source=opened())
    if not kept:
        raise VideoDecodeError(f"{name}: the video stream has no decodable frame; re-encode it")
    return frames, (total, src_fps, duration), wanted, kept


def _guarded(path: Any, read: Any, *args: Any, source: Any = None) -> Any:
    """Call ``read(container, path, *args)`` on a freshly opened file (or ``source``, a
    file-like object; ``path`` then only names it in messages).

    Any PyAV/FFmpeg failure (not a media file, truncated, bad codec data) becomes a
    ``VideoDecodeError`` naming the file and a fix.
    """
    import av

    try:
        with av.open(source if source is not None else str(path)) as container:
            return read(container, path, *args)
    except VideoDecodeError:
        raise
    except av.error.DecoderNotFoundError as err:  # the container is fine, its codec is not
        raise VideoDecodeError(
            f"{path}: unsupported video codec (no decoder for it in this FFmpeg build: {err}); "
            f"re-encode it, e.g. `{_REENCODE}`"
        ) from err
    except av.FFmpegError as err:  # PyAV's base error for open/demux/decode
        raise VideoDecodeError(
            f"{path}: cannot decode as video ({type(err).__name__}: {err}); "
            f"re-encode it, e.g. `{_REENCODE}`"
        ) from err


_REENCODE = "ffmpeg -i IN -c:v libx264 -pix_fmt yuv420p OUT.mp4"


def _probe(container: Any, path: Path, limits: DecodeLimits) -> tuple[int, float, float]:
    """(total frames, source fps, duration s) of the first video stream, within `limits`."""
    if not container.streams.video:
        raise VideoDecodeError(f"{path}: the file has no video stream (audio only?); pass a video")
    stream = container.streams.video[0]
    rate = stream.average_rate or stream.guessed_rate or stream.base_rate
    src_fps = float(rate) if rate else 0.0
    if stream.duration is not None and stream.time_base is not None:
        duration = float(stream.duration * stream.time_base)
    elif container.duration is not None:  # webm/mkv: only the container knows (in µs)
        duration = container.duration / 1_000_000
    else:
        duration = 0.0
    total = stream.frames
    if total <= 0:  # webm/mkv headers carry no frame count: estimate it
        total = round(duration * src_fps)
    if total <= 0:
        raise VideoDecodeError(
            f"{path}: the video stream is empty or has no duration/fps (a still image?); "
            "pass a real video or re-encode the file"
        )
    if src_fps <= 0 and duration > 0:
        src_fps = total / duration
    ctx = stream.codec_context
    if ctx is None:  # the container is fine, its codec is not
        raise VideoDecodeError(f"{path}: unsupported video codec (no decoder for it in this FFmpeg build); "
                               f"re-encode it, e.g. `{_REENCODE}`")
    limits.check(path, ctx.width, ctx.height, total, duration)
    return total, src_fps, duration


def _decode_indices(
    container: Any, path: Path, wanted: list[int], limits: DecodeLimits
) -> tuple[np.ndarray | None, list[int], int]:
    """Decode in presentation order, converting only frames whose running index is in
    ``wanted`` (to RGB at the limits' output size) into one array allocated at the first of them.

    Returns (frames [len(kept), H, W, 3] uint8, their indices, frames seen). ``seen`` is the real
    frame count when the stream ended before the last wanted index (an estimated count that
    overshot), else 0.
    """
    stream = container.streams.video[0]
    stream.thread_type = "AUTO"  # frame threads: large frames decode faster, same pixels
    deadline = time.monotonic() + limits.timeout_s
    wanted_set, last = set(wanted), max(wanted)
    out: np.ndarray | None = None  # [len(wanted), H, W, 3]
    kept: list[int] = []
    index = -1
    for index, frame in enumerate(container.decode(stream)):
        if time.monotonic() > deadline:
            raise VideoDecodeError(f"{path}: decoding took over {limits.timeout_s:g} s (timeout_s); "
                                   "send a shorter or smaller video")
        if index in wanted_set:
            if out is None:
                width, height = limits.output_size(frame.width, frame.height)
                out = np.empty((len(wanted), height, width, 3), dtype=np.uint8)
            out[len(kept)] = frame.to_ndarray(width=width, height=height, format="rgb24")
            kept.append(index)
        if index >= last:
            return out[: len(kept)], kept, 0
    return (None if out is None else out[: len(kept)]), kept, index + 1
