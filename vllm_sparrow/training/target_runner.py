"""The target video LLM in transformers, as capture needs it: encode, answer, hidden states.

Final hidden states are the language model's `last_hidden_state` (after its final norm): the
tensor vLLM hands the proposer at serve time (test_captured_hidden_states_are_what_vllm_hands_the_proposer
in tests/test_training_pipeline_end_to_end.py pins this). Intermediate states are
`hidden_states[L]`, the output of decoder layer L.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from ..prompts import chat_prompt
from ..targets import target_spec
from .data import MediaKind


class TargetInputs:
    """A target's prompt side, shared by the transformers capture (HFTarget) and the engine's
    (engine_target.py): its config, processor and tokenizer, the chat prompt, the processor's
    inputs for a sample, and a dataset answer's tokens."""

    def __init__(self, target_dir: str) -> None:
        from transformers import AutoConfig, AutoProcessor, GenerationConfig

        cfg = AutoConfig.from_pretrained(target_dir)
        self.spec = target_spec(cfg)
        self.is_vision = bool(self.spec.visual_token_ids)
        text = cfg.get_text_config()
        self.max_positions: int | None = getattr(text, "max_position_embeddings", None)
        self.processor = AutoProcessor.from_pretrained(target_dir)
        self.tokenizer = getattr(self.processor, "tokenizer", self.processor)
        try:
            eos = GenerationConfig.from_pretrained(target_dir).eos_token_id
        except OSError:  # no generation_config.json: the model config's
            eos = getattr(cfg, "eos_token_id", None)
        self.eos_ids = [eos] if isinstance(eos, int) else list(eos or [])

    @property
    def num_layers(self) -> int:
        return self.spec.num_layers

    def chat_prompt(self, prompt: str, media_kind: MediaKind | None) -> str:
        """The one-turn chat text (media before the text), as vLLM's generate() takes it too."""
        return chat_prompt(self.processor, prompt, media_kind)

    def encode(self, prompt: str, media_kind: MediaKind | None, media: Any) -> dict[str, torch.Tensor]:
        """Processor inputs (batch 1) for a one-turn chat with the media before the text."""
        text = self.chat_prompt(prompt, media_kind)
        kw: dict[str, Any] = {}
        if media_kind == "video":
            frames, meta = media
            # Frames arrive sampled already; HF's VideoMetadata does not take our flag.
            kw = dict(videos=[frames], do_sample_frames=False,
                      video_metadata=[{k: v for k, v in meta.items() if k != "do_sample_frames"}])
        elif media_kind == "image":
            kw = dict(images=[media])
        if not self.is_vision:
            return dict(self.tokenizer([text], return_tensors="pt", add_special_tokens=False))
        return dict(self.processor(text=[text], return_tensors="pt", **kw))

    def response_ids(self, response: str) -> list[int]:
        """A dataset answer as the target would have ended it (end-of-turn token appended)."""
        return self.tokenizer(response, add_special_tokens=False)["input_ids"] + self.eos_ids[:1]


class HFTarget(TargetInputs):
    """The target model in transformers: its greedy answers and hidden states, one sample at a time."""

    def __init__(self, target_dir: str, device: str = "cpu", dtype: torch.dtype = torch.float32,
                 attn_implementation: str | None = None) -> None:
        from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

        super().__init__(target_dir)
        auto = AutoModelForImageTextToText if self.is_vision else AutoModelForCausalLM
        kw = {"attn_implementation": attn_implementation} if attn_implementation else {}
        self.model = auto.from_pretrained(target_dir, dtype=dtype, **kw).to(device).eval()
        eos = self.model.generation_config.eos_token_id
        self.eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
        self.device = torch.device(device)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.get_input_embeddings()(ids)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.get_output_embeddings()(hidden)

    @torch.no_grad()
    def answer(self, inputs: dict[str, torch.Tensor], max_new_tokens: int) -> list[int]:
        """The target's own greedy answer (ends with its end-of-turn token unless cut)."""
        out = self.model.generate(**self._to_device(inputs), max_new_tokens=max_new_tokens,
                                  do_sample=False, pad_token_id=self.eos_ids[0] if self.eos_ids else 0)
        return out[0, inputs["input_ids"].shape[1]:].tolist()

    @torch.no_grad()
    def states(self, inputs: dict[str, torch.Tensor], response: list[int], layer: int,
               aux_layers: tuple[int, ...] = ()) -> TargetStates:
        """Run prompt + response once: token ids [n], final hidden [n, H] after the final norm,
        layer-`layer` hidden [n, H], the full inputs, and (EAGLE-3) the residual stream entering
        each of `aux_layers`, concatenated in that order [n, len(aux_layers) * H] (None without)."""
        full = extend_with_response(inputs, response)
        out = self.model.model(**self._to_device(full), output_hidden_states=True)
        # hidden_states[k] enters decoder layer k (k = 0: the embeddings, vision merged), the
        # residual stream vLLM hands an EAGLE-3 draft for layer id k.
        aux = torch.cat([out.hidden_states[k][0].float() for k in aux_layers], -1) if aux_layers else None
        return TargetStates(full["input_ids"][0], out.last_hidden_state[0].float(),
                            out.hidden_states[layer][0].float(), full, aux)

    @torch.no_grad()
    def eagle_positions(self, full: dict[str, torch.Tensor]) -> torch.Tensor:
        """Rotary positions vLLM gives a 1-D-RoPE EAGLE draft: M-RoPE's temporal row for
        Qwen-VL targets, plain indices otherwise.  -> [n]"""
        base = self.model.model
        if not hasattr(base, "get_rope_index"):
            return torch.arange(full["input_ids"].shape[1])
        import inspect

        names = inspect.signature(base.get_rope_index).parameters
        kw = {k: v for k, v in self._to_device(full).items() if k in names}
        position_ids, _ = base.get_rope_index(**kw)  # [3, 1, n]
        return position_ids[0, 0].cpu()

    def _to_device(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: v.to(self.device) if torch.is_tensor(v) else v for k, v in inputs.items()}


class TargetStates(NamedTuple):
    token_ids: torch.Tensor  # [n]
    final: torch.Tensor  # [n, H] after the final norm
    layer: torch.Tensor  # [n, H] the IVSB layer's output
    full: dict[str, torch.Tensor]  # the inputs of prompt + response
    aux: torch.Tensor | None  # [n, A * H] EAGLE-3 auxiliary states, or None


def eagle3_layer_ids(num_layers: int) -> tuple[int, ...]:
    """vLLM 0.32's default EAGLE-3 auxiliary layers for a target of `num_layers` decoder layers
    (SupportsEagle3.get_eagle3_default_aux_hidden_state_layers: 2, L // 2, L - 3), sorted and
    de-duplicated as vLLM stores them, which is the order the draft's fc reads them in. Ids
    below L only (HF's entry L is after the final norm, vLLM's is not); a target too shallow
    for three of them uses its first min(3, L) layers. The export writes the ids it used."""
    ids = sorted(k for k in {2, num_layers // 2, num_layers - 3} if 0 <= k < num_layers)
    return tuple(ids) if len(ids) == 3 else tuple(range(min(3, num_layers)))


def extend_with_response(inputs: dict[str, torch.Tensor], response: list[int]) -> dict[str, torch.Tensor]:
    """Append response tokens to a batch-1 processor output (text positions: type id 0)."""
    extra = torch.tensor([response], dtype=inputs["input_ids"].dtype)
    full = dict(inputs)
    full["input_ids"] = torch.cat([inputs["input_ids"], extra], 1)
    for key in ("attention_mask", "mm_token_type_ids", "token_type_ids"):
        if key in inputs:
            fill = torch.ones_like(extra) if key == "attention_mask" else torch.zeros_like(extra)
            full[key] = torch.cat([inputs[key], fill.to(inputs[key].dtype)], 1)
    return full
