"""The EAGLE-3 baseline draft: the architecture vLLM 0.32 serves for `method: "eagle3"`
(model_executor/models/llama_eagle3.py; docs/eagle3-in-vllm.md), as a trainable torch module,
and its export in vLLM's native format.

One pass of the draft at position p (target token t_p, next token t_{p+1}):

    first pass:   h = fc(concat(aux_1[p], ..., aux_A[p]))       # [H]  the target's layers
    later passes: h = the draft's own pre-norm output at p-1     # [H]  (no fc)
    x = concat(input_layernorm(embed(t_{p+1})), hidden_norm(h))  # [2H]
    a = h + o_proj(attention(q/k/v_proj(x)))                     # residual: h un-normed
    y = a + mlp(post_attention_layernorm(a))                     # pre-norm output (fed back)
    logits = lm_head(norm(y))                                    # [draft_vocab]

The embedding is the target's (shared by vLLM); the LM head is the draft's own, optionally over
a reduced vocabulary with vLLM's map target_id = draft_id + d2t[draft_id].
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from ..durable import atomic_save_safetensors, atomic_write_json
from ..model import RMSNorm, rotary

ARCHITECTURE = "LlamaForCausalLMEagle3"  # a name vLLM maps to Eagle3LlamaForCausalLM


@dataclass
class Eagle3Config:
    hidden_size: int  # the draft's width; equals the target's (the embedding is shared)
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int  # the target's
    aux_layer_ids: tuple[int, ...]  # target layers whose input states the fc reads, ascending
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 32768
    draft_vocab: list[int] | None = field(default=None)  # ascending target ids; None: all

    # The training-time test (objective.unrolled_stages) reads these: EAGLE-3 attends to every earlier
    # position, no anchors and no window.
    anchor_tokens = 0
    window_tokens = None

    @property
    def draft_vocab_size(self) -> int:
        return self.vocab_size if self.draft_vocab is None else len(self.draft_vocab)

    def to_hf(self) -> dict:
        """config.json in vLLM's native EAGLE-3 format (every field vLLM reads written out)."""
        return {
            "architectures": [ARCHITECTURE], "model_type": "llama", "num_hidden_layers": 1,
            "hidden_size": self.hidden_size, "target_hidden_size": self.hidden_size,
            "num_attention_heads": self.num_attention_heads, "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim, "intermediate_size": self.intermediate_size, "hidden_act": "silu",
            "vocab_size": self.vocab_size, "draft_vocab_size": self.draft_vocab_size,
            "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings, "tie_word_embeddings": False,
            "eagle_aux_hidden_state_layer_ids": list(self.aux_layer_ids),
            "num_aux_hidden_states": len(self.aux_layer_ids), "norm_before_residual": False,
            "attention_bias": False, "mlp_bias": False, "torch_dtype": "float32",
            "sparrow_eagle3": {"draft_vocab": self.draft_vocab},  # to rebuild this module from the export
        }

    @classmethod
    def from_hf(cls, hf: dict) -> Eagle3Config:
        return cls(hidden_size=hf["hidden_size"], num_attention_heads=hf["num_attention_heads"],
                   num_key_value_heads=hf["num_key_value_heads"], head_dim=hf["head_dim"],
                   intermediate_size=hf["intermediate_size"], vocab_size=hf["vocab_size"],
                   aux_layer_ids=tuple(hf["eagle_aux_hidden_state_layer_ids"]), rms_norm_eps=hf["rms_norm_eps"],
                   rope_theta=hf["rope_theta"], max_position_embeddings=hf["max_position_embeddings"],
                   draft_vocab=hf.get("sparrow_eagle3", {}).get("draft_vocab"))


class _MLP(nn.Module):
    def __init__(self, h: int, inter: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(h, inter, bias=False)
        self.up_proj = nn.Linear(h, inter, bias=False)
        self.down_proj = nn.Linear(inter, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class _MidLayer(nn.Module):
    """vLLM's layer 0 of an EAGLE-3 draft (parameter names as its checkpoints spell them)."""

    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.hidden_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.input_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(2 * h, cfg.num_attention_heads * d, bias=False)
        self.self_attn.k_proj = nn.Linear(2 * h, cfg.num_key_value_heads * d, bias=False)
        self.self_attn.v_proj = nn.Linear(2 * h, cfg.num_key_value_heads * d, bias=False)
        self.self_attn.o_proj = nn.Linear(cfg.num_attention_heads * d, h, bias=False)
        self.mlp = _MLP(h, cfg.intermediate_size)


class Eagle3Draft(nn.Module):
    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.fc = nn.Linear(len(cfg.aux_layer_ids) * h, h, bias=False)
        self.midlayer = _MidLayer(cfg)
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(h, cfg.draft_vocab_size, bias=False)
        if cfg.draft_vocab is not None:
            ids = torch.tensor(cfg.draft_vocab, dtype=torch.long)
            self.register_buffer("draft_ids", ids, persistent=False)  # [N] draft id -> target id

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:  # [n, A * H] -> [n, H] (first pass only)
        return self.fc(aux)

    def forward(self, h: torch.Tensor, embeds: torch.Tensor, positions: torch.Tensor, attend) -> torch.Tensor:
        """h [n, H] (fused target states or the draft's own), embeds [n, H] of the next tokens,
        positions [n]; attend(q [n, heads, D], k, v [n, kv, D]) -> [n, heads, D].
        Returns the pre-norm output y [n, H] (logits: self.logits(y); fed back as the next h)."""
        cfg, m = self.cfg, self.midlayer
        n, d = h.shape[0], cfg.head_dim
        x = torch.cat([m.input_layernorm(embeds), m.hidden_norm(h)], -1)  # [n, 2H]
        q = rotary(m.self_attn.q_proj(x).view(n, cfg.num_attention_heads, d), positions, cfg.rope_theta)
        k = rotary(m.self_attn.k_proj(x).view(n, cfg.num_key_value_heads, d), positions, cfg.rope_theta)
        v = m.self_attn.v_proj(x).view(n, cfg.num_key_value_heads, d)
        a = h + m.self_attn.o_proj(attend(q, k, v).reshape(n, -1))
        return a + m.mlp(m.post_attention_layernorm(a))

    def logits(self, y: torch.Tensor) -> torch.Tensor:  # [n, H] -> [n, draft_vocab]
        return self.lm_head(self.norm(y))

    def save(self, out_dir: str | Path) -> Path:
        """vLLM's native EAGLE-3 checkpoint: model.safetensors (no "model." prefix) + config.json."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        if self.cfg.draft_vocab is not None:  # vLLM: target_id = draft_id + d2t[draft_id]
            ids = torch.tensor(self.cfg.draft_vocab, dtype=torch.long)
            state["d2t"] = ids - torch.arange(len(ids))
        atomic_save_safetensors(out / "model.safetensors", state, metadata={"format": "pt"})
        atomic_write_json(out / "config.json", self.cfg.to_hf())  # last: a config means whole weights
        return out

    @classmethod
    def load(cls, draft_dir: str | Path) -> Eagle3Draft:
        from safetensors.torch import load_file

        cfg = Eagle3Config.from_hf(json.loads((Path(draft_dir) / "config.json").read_text()))
        model = cls(cfg)
        state = load_file(str(Path(draft_dir) / "model.safetensors"))
        state.pop("d2t", None)
        model.load_state_dict(state)
        return model


def init_eagle3(target_dir: str | Path, aux_layer_ids: tuple[int, ...] | None = None,
                draft_vocab: list[int] | None = None, seed: int = 0) -> Eagle3Draft:
    """A randomly initialised EAGLE-3 draft shaped for the target (its width, heads, vocabulary,
    RoPE base) reading vLLM's default auxiliary layers of it."""
    from transformers import AutoConfig

    from ..config import target_layer_shape
    from ..model import seeded_draft
    from ..targets import target_spec
    from .target_runner import eagle3_layer_ids

    hf = AutoConfig.from_pretrained(str(target_dir))
    spec = target_spec(hf)
    cfg = Eagle3Config(**target_layer_shape(hf), aux_layer_ids=tuple(aux_layer_ids or eagle3_layer_ids(spec.num_layers)),
                       draft_vocab=draft_vocab)
    return seeded_draft(Eagle3Draft, cfg, seed)

