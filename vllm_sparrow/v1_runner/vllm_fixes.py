"""General fixes of vLLM 0.32 met on the way (and one addition, the pyav video codec): bugs of the
host library, not parts of the Sparrow method. Each is declared in ROWS beside its code, with the
internals its code reads; patches.py joins ROWS into the one table and applies them, and
SPARROW_DISABLE_PATCHES=name,... turns any of them off (docs/vllm-patches.md lists them).
"""

from __future__ import annotations

import functools
from typing import Callable

from .. import LOGGER
from ..patch_helper import Declared, Read, replace_attr, set_entry


# ---- CPU build --------------------------------------------------------------------------
def _patch_cpu_kernel_overrides() -> None:
    from vllm.platforms import current_platform

    cls = type(current_platform)

    def make(original):
        done = []

        @functools.wraps(original)
        def register_once() -> None:
            if not done:
                original()
                done.append(True)

        return classmethod(lambda _cls: register_once())

    replace_attr("cpu-kernel-overrides-once", cls, "register_triton_kernel_overrides", make)


def _patch_cpu_topk_empty_batch() -> None:
    from vllm.v1.sample.ops import topk_topp_sampler

    def make(original: Callable) -> Callable:
        @functools.wraps(original)
        def apply_top_k_only(logits, k):
            if logits.shape[0] == 0:  # a verify step with no draft rows: nothing to mask
                return logits
            return original(logits, k)

        return apply_top_k_only

    replace_attr("cpu-topk-empty-batch", topk_topp_sampler, "apply_top_k_only", make)


def _patch_cpu_expand_kernel() -> None:
    from vllm.utils import cpu_triton_utils

    # Upstream's register_triton_kernel_overrides reads this attribute when a worker starts,
    # which is after the plugin loads, so the fixed version is the one registered.
    replace_attr("cpu-expand-kernel-dtype", cpu_triton_utils, "_expand_kernel_impl",
                 lambda _original: expand_batch_values)


def expand_batch_values(output, input_val, cu_num_tokens, replace_from, replace_to,
                        MAX_NUM_TOKENS=None) -> None:  # noqa: N803 (the kernel's argument name)
    """Write input_val[r] (replace_from -> replace_to) over request r's tokens, in place.

    Same contract as vLLM's Triton expand_kernel: output [num_tokens], input_val [batch],
    cu_num_tokens [batch] (inclusive cumulative token counts); output keeps its dtype.
    """
    import torch

    replacement = torch.tensor(replace_to, dtype=input_val.dtype)
    values = torch.where(input_val == replace_from, replacement, input_val)  # [batch]
    ends = cu_num_tokens.to(torch.int64)  # [batch]
    counts = torch.diff(ends, prepend=ends.new_zeros(1))  # [batch]
    expanded = values.repeat_interleave(counts)  # [num_tokens]
    output[: expanded.numel()].copy_(expanded.to(output.dtype))


# ---- models -----------------------------------------------------------------------------
def _patch_llava_ov_video_lengths() -> None:
    from vllm.model_executor.models import llava_onevision

    def make(original: Callable) -> Callable:
        @functools.wraps(original)
        def _process_video_pixels(self, inputs):
            out = original(self, inputs)
            if isinstance(out, list):  # per video [1, frames * tokens + 1, hidden] -> 2-D
                return [e.squeeze(0) if e.dim() == 3 else e for e in out]
            return out

        return _process_video_pixels

    replace_attr("llava-ov-mixed-video-lengths", llava_onevision.LlavaOnevisionForConditionalGeneration,
           "_process_video_pixels", make)


# ---- video decoding ---------------------------------------------------------------------
def _register_pyav_video_codec() -> None:
    import sys
    import types

    from vllm.multimodal import video_decoders

    name = f"{video_decoders.__name__}.pyav"
    module = types.ModuleType(name)
    module.decode_pyav = decode_pyav  # vLLM imports f".{backend}" and calls decode_<backend>
    sys.modules[name] = module
    from dataclasses import asdict

    from ..video import DecodeLimits

    # The backend's options (its limits), settable in --media-io-kwargs' "video" object.
    set_entry("pyav-video-codec", video_decoders._BACKEND_OPTION_DEFAULTS,
               f"{video_decoders.__name__}._BACKEND_OPTION_DEFAULTS", "pyav", asdict(DecodeLimits()))


def decode_pyav(loader_cls, data: bytes, target, sampling_kwargs: dict, **limits):
    """vLLM decoder contract: (frames, VideoSourceMetadata, wanted indices, decoded indices).

    Frame choice stays the loader's (uniform sampling by num_frames/fps, Qwen3-VL's own rule);
    `limits` are DecodeLimits fields (frame size, frame count, duration, time, decoded size).
    """
    from vllm.multimodal.video_decoders import VideoSourceMetadata

    from ..video import DecodeLimits, decode_video_bytes

    chosen = {}

    def pick(total: int, fps: float, duration: float) -> list[int]:
        source = loader_cls._prepare_source(VideoSourceMetadata(total, fps, duration))
        chosen["source"] = source
        return loader_cls.compute_frames_index_to_sample(source=source, target=target, **sampling_kwargs)

    frames, _, wanted, kept = decode_video_bytes(data, pick, name="the request's video",
                                                 limits=DecodeLimits(**limits))
    return frames, chosen["source"], wanted, kept


def opencv_importable() -> bool:
    try:
        import cv2  # noqa: F401
    except Exception:  # ImportError, or a wheel whose shared libraries fail to load
        return False
    return True


def _patch_video_codec_fallback() -> None:
    from vllm.logger import init_logger
    from vllm.multimodal import video as video_mod

    logger = init_logger(LOGGER)

    def make(original: Callable) -> Callable:
        @functools.wraps(original)
        def decode_video(backend, loader_cls, data, target, sampling_kwargs, backend_kwargs, *, frame_recovery):
            if backend == "opencv" and not opencv_importable():
                if not getattr(decode_video, "warned", False):
                    decode_video.warned = True
                    logger.warning("vllm-sparrow: opencv (cv2) cannot be imported; decoding videos with "
                                   "PyAV instead (choose a codec with --media-io-kwargs "
                                   "'{\"video\": {\"backend\": ...}}')")
                return original("pyav", loader_cls, data, target, sampling_kwargs, {}, frame_recovery=False)
            return original(backend, loader_cls, data, target, sampling_kwargs, backend_kwargs,
                            frame_recovery=frame_recovery)

        return decode_video

    replace_attr("video-codec-fallback", video_mod, "decode_video", make)


def _patch_video_num_frames_warning() -> None:
    from vllm.logger import init_logger
    from vllm.multimodal import video as video_mod
    from vllm.multimodal.media.video import VideoMediaIO

    # vLLM's Qwen2-VL / Qwen2.5-VL / Qwen3-VL loaders sample by fps and ignore num_frames (their
    # docstrings say so); a server started with num_frames would believe it capped frames.
    fps_driven = tuple(getattr(video_mod, n) for n in ("Qwen2VLVideoBackend", "Qwen3VLVideoBackend")
                       if hasattr(video_mod, n))
    logger = init_logger(LOGGER)

    def make(original: Callable) -> Callable:
        @functools.wraps(original)
        def __init__(self, image_io, *args, **kwargs) -> None:
            original(self, image_io, *args, **kwargs)
            asked = kwargs.get("num_frames", args[0] if args else None)
            loader = type(self.video_loader).__name__
            if asked is not None and isinstance(self.video_loader, fps_driven) and loader not in __init__.warned:
                __init__.warned.add(loader)  # once per loader and process
                logger.warning("vllm-sparrow: num_frames=%s in media_io_kwargs has no effect on this model: vLLM's "
                               "%s samples video frames by fps and ignores num_frames; bound frames (and visual "
                               "tokens) with \"fps\" instead, e.g. --media-io-kwargs '{\"video\": {\"fps\": 1}}'",
                               asked, loader)

        __init__.warned = set()  # loaders warned about (tests clear it)
        return __init__

    replace_attr("video-num-frames-ignored", VideoMediaIO, "__init__", make)


# ---- the OpenAI server -------------------------------------------------------------------
def _patch_chat_empty_prompt() -> None:
    from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat

    def make(original: Callable) -> Callable:
        @functools.wraps(original)
        async def create_chat_completion(self, request, raw_request=None):
            if not any(_has_content(m) for m in request.messages):
                return self.create_error_response(
                    "empty prompt: no message has text, an image or a video; send at least one "
                    "user message with content")
            return await original(self, request, raw_request)

        return create_chat_completion

    replace_attr("chat-empty-prompt", OpenAIServingChat, "create_chat_completion", make)


def _has_content(message) -> bool:
    content = message.get("content") if isinstance(message, dict) else getattr(message, "content", None)
    if isinstance(content, str):
        return bool(content.strip())
    for part in content or []:
        kind = part.get("type") if isinstance(part, dict) else getattr(part, "type", None)
        text = part.get("text") if isinstance(part, dict) else getattr(part, "text", None)
        if kind != "text" or (text or "").strip():
            return True
    return False


LOCAL_MEDIA_REFUSED = (
    "file:// media URLs are refused: the server was started without --allowed-local-media-path. "
    "Send the media inline (a data: URL) or over http(s), or start the server with "
    "--allowed-local-media-path DIR, a directory the files lie under")


def _patch_local_media_errors() -> None:
    from pathlib import Path
    from urllib.request import url2pathname

    from vllm.exceptions import VLLMValidationError
    from vllm.multimodal.media.connector import MediaConnector

    # Upstream raises a bare RuntimeError (no --allowed-local-media-path) or lets the decoder's
    # FileNotFoundError out (a missing file in the allowed folder), which the API server's
    # catch-all handler answers with a 500 from Starlette's ServerErrorMiddleware, which then
    # re-raises, so uvicorn closes the connection. A VLLMValidationError is answered with a 400 by
    # vLLM's own VLLMError handler; keeping upstream's types keeps offline callers (LLM.chat) that
    # catch them working.
    class LocalMediaRefused(VLLMValidationError, RuntimeError):
        pass

    class LocalMediaMissing(VLLMValidationError, FileNotFoundError):
        pass

    def make(original: Callable) -> Callable:
        @functools.wraps(original)
        def _load_file_url(self, url_spec, media_io):
            folder = self.allowed_local_media_path
            if folder is None:  # upstream's own condition for its RuntimeError
                raise LocalMediaRefused(LOCAL_MEDIA_REFUSED)
            path = Path(url2pathname((url_spec.netloc or "") + (url_spec.path or "")))  # as upstream reads it
            if folder in path.resolve().parents and not path.is_file():  # outside: upstream's 400 stands
                # vLLM masks paths in error answers (<path>), so the client is told the file's name
                raise LocalMediaMissing(f"file:// media URL: no file {path.name!r} at that path in the folder "
                                        "--allowed-local-media-path names; check the path, or send the media "
                                        "inline (a data: URL)")
            return original(self, url_spec, media_io)

        return _load_file_url

    replace_attr("local-media-errors", MediaConnector, "_load_file_url", make)


# ---- the rows -----------------------------------------------------------------------------
_VIDEO = "vllm.multimodal.video"
ROWS: tuple[Declared | Read, ...] = (
    Declared("cpu-kernel-overrides-once", "vllm.platforms.cpu.CpuPlatform.register_triton_kernel_overrides",
             "fix", "cpu", "runs once per process: re-registration failed for a second engine in one process "
             "after a speculative one", _patch_cpu_kernel_overrides),
    Declared("cpu-expand-kernel-dtype", "vllm.utils.cpu_triton_utils._expand_kernel_impl", "fix", "cpu",
             "the rejection sampler's expand_kernel stand-in wrote into an int64 copy, leaving per-token "
             "temperatures (and top-k/top-p) uninitialised: every T > 0 spec-decode run sampled from a wrong "
             "distribution; replaced by a dtype-preserving torch version", _patch_cpu_expand_kernel),
    Declared("cpu-topk-empty-batch", "vllm.v1.sample.ops.topk_topp_sampler.apply_top_k_only", "fix", "cpu",
             "the top-k mask took k.max() of an empty batch on a verify step without draft rows, so any "
             "speculative run with top_k failed; an empty batch is returned as is", _patch_cpu_topk_empty_batch),
    Declared("llava-ov-mixed-video-lengths",
             "vllm.model_executor.models.llava_onevision.LlavaOnevisionForConditionalGeneration._process_video_pixels",
             "fix", "any", "a batch of videos of different frame counts gave [1, N, H] per video, which vLLM "
             "rejects (engine crash); [N, H] is handed back as embed_multimodal's contract asks",
             _patch_llava_ov_video_lengths),
    Declared("pyav-video-codec", "vllm.multimodal.video_decoders._BACKEND_OPTION_DEFAULTS['pyav']", "fix", "any",
             "vLLM's video decoders gain \"pyav\" (`--media-io-kwargs '{\"video\": {\"backend\": \"pyav\"}}'`), "
             "with the decode limits of video.DecodeLimits as its options (the CPU wheel's torchcodec cannot load)",
             _register_pyav_video_codec),
    Read("vllm.multimodal.video_decoders.VideoSourceMetadata", "pyav-video-codec",
         "the (frames, fps, duration) record a decoder hands back", "class", needs=("pyav-video-codec",)),
    Read(f"{_VIDEO}.VideoLoader._prepare_source", "pyav-video-codec",
         "the loader's own view of the source before it picks frames", "class", needs=("pyav-video-codec",)),
    Read(f"{_VIDEO}.VideoLoader.compute_frames_index_to_sample", "pyav-video-codec",
         "the loader's frame choice (uniform, by fps, Qwen3-VL's rule), kept as the loader's",
         "class", needs=("pyav-video-codec",)),
    Declared("video-codec-fallback", f"{_VIDEO}.decode_video", "fix", "any",
             "when the default opencv codec is asked for but cv2 cannot be imported, videos are decoded with "
             "pyav instead of failing every video request (logged once; a chosen codec is never replaced)",
             _patch_video_codec_fallback, needs=("pyav-video-codec",)),
    Declared("video-num-frames-ignored", "vllm.multimodal.media.video.VideoMediaIO.__init__", "fix", "any",
             "num_frames in media_io_kwargs is ignored by vLLM's fps-driven Qwen2-VL/Qwen2.5-VL/Qwen3-VL video "
             "loaders; the first such video logs a warning that says to bound frames with fps",
             _patch_video_num_frames_warning),
    Read("vllm.multimodal.media.video.VideoMediaIO.video_loader", "video-num-frames-ignored",
         "the loader class a request's video goes to", "instance", needs=("video-num-frames-ignored",)),
    Read(f"{_VIDEO}.Qwen2VLVideoBackend", "video-num-frames-ignored",
         "an fps-driven loader (absent: not warned about)", "class", required=False,
         needs=("video-num-frames-ignored",)),
    Read(f"{_VIDEO}.Qwen3VLVideoBackend", "video-num-frames-ignored",
         "an fps-driven loader (absent: not warned about)", "class", required=False,
         needs=("video-num-frames-ignored",)),
    Declared("chat-empty-prompt", "vllm.entrypoints.openai.chat_completion.serving.OpenAIServingChat"
             ".create_chat_completion", "fix", "any", "a chat request whose messages carry no text, image or "
             "video gets a 400 saying so (vLLM would generate from the bare chat template)",
             _patch_chat_empty_prompt),
    Read("vllm.entrypoints.openai.chat_completion.serving.OpenAIServingChat.create_error_response",
         "chat-empty-prompt", "the server's own 400 answer", "class", needs=("chat-empty-prompt",)),
    Declared("local-media-errors", "vllm.multimodal.media.connector.MediaConnector._load_file_url",
             "fix", "any", "a file:// media URL sent to a server started without --allowed-local-media-path, or "
             "naming a file missing from that folder, raised a RuntimeError or FileNotFoundError: a 500 and a "
             "dropped connection; it gets a 400 that names the flag or the missing file", _patch_local_media_errors),
    Read("vllm.multimodal.media.connector.MediaConnector.allowed_local_media_path", "local-media-errors",
         "the folder --allowed-local-media-path names (None: refused)", "instance", needs=("local-media-errors",)),
)
