"""PyAV video decoding on vLLM 0.34, as a loader of its public video-loader registry (no patch).

On vLLM 0.32 PyAV is a codec the plugin adds below vLLM's loaders (v1_runner/vllm_fixes.py:
`--media-io-kwargs '{"video": {"backend": "pyav"}}'`). 0.34 closed that layer (a fixed list of
codecs) and opened another: loaders are registered by name (vllm/multimodal/video.py,
VIDEO_LOADER_REGISTRY) and chosen per server or request by `video_backend`:

    --media-io-kwargs '{"video": {"video_backend": "pyav", "sampling": "qwen2_vl", "fps": 2}}'

A loader is both how frames are chosen and how they are decoded. This one decodes with PyAV,
bounded as on 0.32 (vllm_sparrow.video.DecodeLimits: max_frame_pixels, max_frames,
max_duration_s, timeout_s, decode_pixels, settable in the same object), and chooses frames by
the rule of the vLLM loader named by `sampling`: "opencv" (vLLM's default: uniform by num_frames
and fps, the default here too), "qwen2_vl" (Qwen2-VL and Qwen2.5-VL's fps rule) or "qwen3_vl".
A Qwen-VL server's own loader is its processor's (qwen2_vl, qwen3_vl); an explicit `video_backend`
replaces it, so such a server names its rule in `sampling` to get the frames its own loader, and
0.32's pyav codec under it, would take. Frame sampling options other than the limits (min_frames,
temporal_patch_size, ...) go to the rule; `max_frames` is the decode limit, as on 0.32.

Not registered with `video_processor=`: that would take every Qwen-VL server's videos over.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

from ..video import DecodeLimits, decode_video_bytes

NAME = "pyav"
SAMPLING = ("opencv", "qwen2_vl", "qwen3_vl")  # vLLM loaders whose frame choice this one can take
LIMITS = tuple(f.name for f in dataclasses.fields(DecodeLimits))


def register() -> None:
    """Registers the "pyav" loader in this process's registry (the plugin does, on 0.34)."""
    from vllm.multimodal.video import VIDEO_LOADER_REGISTRY, VideoLoader

    class PyAVVideoLoader(VideoLoader):
        @classmethod
        def load_bytes(cls, data: bytes, num_frames: int = -1, fps: float | None = None, max_duration: int = 300,
                       frame_recovery: bool = False, *, sampling: str = "opencv", **kwargs: Any):
            return load_bytes(data, num_frames, fps, max_duration, sampling, kwargs)

    VIDEO_LOADER_REGISTRY.register(NAME)(PyAVVideoLoader)


def load_bytes(data: bytes, num_frames: int, fps: float | None, max_duration: int, sampling: str,
               options: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """(frames [T, H, W, 3] uint8, the metadata the `sampling` loader would write) of a video's bytes."""
    from vllm.multimodal.video import VIDEO_LOADER_REGISTRY
    from vllm.multimodal.video_decoders import VideoSourceMetadata, VideoTargetMetadata

    if "backend" in options:
        raise ValueError(f"the {NAME!r} video loader decodes with PyAV itself; leave out \"backend\" "
                         f"(a codec of vLLM's own loaders), or choose a loader with \"video_backend\"")
    rule = VIDEO_LOADER_REGISTRY.name2class.get(sampling) if sampling in SAMPLING else None
    if rule is None:
        raise ValueError(f"the {NAME!r} video loader's \"sampling\" must name the vLLM loader whose frame "
                         f"choice to take, one of {', '.join(SAMPLING)}; got {sampling!r}")
    limits = DecodeLimits(**{k: options.pop(k) for k in LIMITS if k in options})
    if fps is None:  # the rule's own default (2 for the Qwen-VL loaders, none for opencv's)
        fps = inspect.signature(rule.load_bytes).parameters["fps"].default
    target = VideoTargetMetadata(num_frames=num_frames, fps=fps, max_duration=max_duration)
    chosen = {}

    def pick(total: int, src_fps: float, duration: float) -> list[int]:
        source = rule._prepare_source(VideoSourceMetadata(total, src_fps, duration))
        chosen["source"] = source
        return rule.compute_frames_index_to_sample(source=source, target=target, **options)

    frames, _, _, kept = decode_video_bytes(data, pick, name="the request's video", limits=limits)
    return frames, rule.create_hf_metadata(source=chosen["source"], valid_frame_indices=kept,
                                           video_backend=f"{NAME}{getattr(rule, '_sampling_suffix', '')}")
