"""The side-by-side baseline: an EAGLE-style draft that attends over every position, visual
ones included (the MSD/ViSpec-like setting the paper compares against), in the format of vLLM's
built-in `eagle` method (EagleLlamaForCausalLM, one layer), trained on the same captures.

It mirrors vLLM's computation exactly, so what trains here is what vLLM serves:
  x = fc([embed(token t+1) ; target final state t])      (no input norms, embed first)
  y = x + attn(x) + mlp(post_attention_layernorm(x + attn(x)))   (input_layernorm disabled,
      no final norm), logits = target LM head(y)
Rotary positions are what vLLM hands a 1-D-RoPE EAGLE draft (capture's `positions`). Embedding
and LM head are the target's (vLLM shares them when the checkpoint has none). At visual
positions the input is the placeholder token's embedding: vLLM's EagleLlama draft does not
take the target's multimodal embeddings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from ..durable import atomic_save_safetensors, atomic_write_json
from ..config import LayerShape, target_layer_shape
from ..model import DecoderBody, RMSNorm, seeded_draft


@dataclass
class EagleBaselineConfig(LayerShape):
    # the training code's window rule: the baseline attends over everything
    anchor_tokens: int = 0
    window_tokens: int | None = None

    def to_hf(self) -> dict:
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 1,
                "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
                "num_attention_heads": self.num_attention_heads, "head_dim": self.head_dim,
                "num_key_value_heads": self.num_key_value_heads, "vocab_size": self.vocab_size,
                "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope_theta, "hidden_act": "silu",
                "max_position_embeddings": 1 << 20, "tie_word_embeddings": False, "torch_dtype": "float32"}


class EagleBaselineDraft(nn.Module, DecoderBody):
    def __init__(self, cfg: EagleBaselineConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=False)
        self._init_attention()
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self._init_mlp()

    def key_values(self, x: torch.Tensor, positions: torch.Tensor):
        return self._key_value(x, positions)  # vLLM's EAGLE layer: no input norm

    def forward(self, target_hidden, next_embeds, positions, attend):  # -> [N, hidden]
        x = self.fc(torch.cat([next_embeds, target_hidden], -1))  # [N, hidden]
        r = x + self._attention(x, positions, attend)
        return r + self._mlp(self.post_attention_layernorm(r))

    # ---- vLLM `eagle` checkpoint --------------------------------------------------------
    _NAMES = {"fc": "fc", "q_proj": "layers.0.self_attn.q_proj", "k_proj": "layers.0.self_attn.k_proj",
              "v_proj": "layers.0.self_attn.v_proj", "o_proj": "layers.0.self_attn.o_proj",
              "post_attention_layernorm": "layers.0.post_attention_layernorm",
              "gate_proj": "layers.0.mlp.gate_proj", "up_proj": "layers.0.mlp.up_proj",
              "down_proj": "layers.0.mlp.down_proj"}

    def save(self, out_dir: str | Path) -> Path:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        state = {f"{self._NAMES[k.split('.')[0]]}.weight": v.detach().contiguous().cpu()
                 for k, v in self.state_dict().items()}
        atomic_save_safetensors(out / "model.safetensors", state, metadata={"format": "pt"})
        atomic_write_json(out / "config.json", self.cfg.to_hf())  # last: its config means whole weights
        return out

    @classmethod
    def load(cls, draft_dir: str | Path) -> "EagleBaselineDraft":
        hf = json.loads((Path(draft_dir) / "config.json").read_text())
        fields = EagleBaselineConfig.__dataclass_fields__
        model = cls(EagleBaselineConfig(**{k: v for k, v in hf.items() if k in fields}))
        weights = load_file(str(Path(draft_dir) / "model.safetensors"))
        model.load_state_dict({f"{k}.weight": weights[f"{n}.weight"] for k, n in cls._NAMES.items()})
        return model


def init_eagle_baseline(target_hf_config, seed: int = 0) -> EagleBaselineDraft:
    shape = {**target_layer_shape(target_hf_config), "rope_theta": LayerShape.rope_theta}
    return seeded_draft(EagleBaselineDraft, EagleBaselineConfig(**shape), seed)


def full_stream(sample: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every position of a captured sample: token ids [n], final states [n, H], positions [n]."""
    if "visual_final" not in sample:
        raise ValueError("this capture has no EAGLE-baseline states; capture with --eagle-baseline")
    is_visual = sample["is_visual"]
    hidden = torch.empty(is_visual.shape[0], sample["text_hidden"].shape[1])
    hidden[~is_visual] = sample["text_hidden"].float()
    hidden[is_visual] = sample["visual_final"].float()
    return sample["token_ids"], hidden, sample["positions"]
