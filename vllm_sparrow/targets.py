"""Which target models Sparrow serves, and what it needs to know about each.

Read from the target's Hugging Face config (a transformers PretrainedConfig), so the same
facts serve `sparrow init-draft`, training and the vLLM glue.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# architecture -> (attribute names of the image and video placeholder token ids)
_VISION_TARGETS: dict[str, tuple[str, str]] = {
    "Qwen2_5_VLForConditionalGeneration": ("image_token_id", "video_token_id"),
    "Qwen2VLForConditionalGeneration": ("image_token_id", "video_token_id"),
    "Qwen3VLForConditionalGeneration": ("image_token_id", "video_token_id"),
    "LlavaOnevisionForConditionalGeneration": ("image_token_index", "video_token_index"),
}
# Text-only targets: useful for tests and for text prompts; no visual positions at all.
_TEXT_TARGETS = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
SUPPORTED_ARCHITECTURES = tuple(_VISION_TARGETS) + _TEXT_TARGETS


class UnsupportedTargetError(ValueError):
    pass


@dataclass(frozen=True)
class TargetSpec:
    architecture: str
    hidden_size: int
    vocab_size: int
    num_layers: int
    # Token ids that stand for image/video embeddings in a prompt. Their positions never
    # enter the draft (text-anchored): the draft only sees text positions.
    visual_token_ids: tuple[int, ...]


def target_spec(hf_config: Any) -> TargetSpec:
    archs = list(getattr(hf_config, "architectures", None) or [])
    arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
    if arch is None:
        raise UnsupportedTargetError(
            f"Sparrow does not support target architecture {archs or '(none)'}; supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}. Serve this model without "
            "speculative_config, or with another speculative method."
        )
    text = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    visual: tuple[int, ...] = ()
    if arch in _VISION_TARGETS:
        visual = tuple(
            int(getattr(hf_config, name)) for name in _VISION_TARGETS[arch]
            if getattr(hf_config, name, None) is not None
        )
    return TargetSpec(
        architecture=arch,
        hidden_size=int(text.hidden_size),
        vocab_size=int(text.vocab_size),
        num_layers=int(text.num_hidden_layers),
        visual_token_ids=visual,
    )
