"""The Sparrow draft: one decoder layer over [target hidden state ; next-token embedding].

Shared by training and serving. The model never sees visual positions: its inputs are the
target's (already visually informed) hidden states of text tokens, and its rotary positions
count text tokens only, so M-RoPE never reaches it. How attention reads keys (the ring
text-window cache at serve time, a masked dense pass in training) is injected as `attend`.
"""

from __future__ import annotations

import weakref

from typing import Any, Callable, Protocol

import torch
from torch import nn

from .config import LayerShape, SparrowConfig

# attend(q [N, heads, head_dim], k [N, kv_heads, head_dim], v [N, kv_heads, head_dim])
#   -> [N, heads, head_dim]; keys/values of the N new entries are the caller's to store.
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotary(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Neox-style RoPE. x: [N, heads, head_dim]; positions: [N] text indices."""
    half = x.shape[-1] // 2
    inv_freq = 1.0 / (theta ** (torch.arange(0, half, device=x.device, dtype=torch.float32) / half))
    angles = positions.float()[:, None] * inv_freq[None, :]  # [N, half]
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]  # [N, 1, half]
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    return out.to(x.dtype)


class DecoderBody:
    """The attention projections and SwiGLU MLP of a one-layer draft, shared by Sparrow's draft
    and the EAGLE-style baseline (training/eagle_baseline.py). A mixin of nn.Modules: the
    attribute names are the checkpoints' weight names, and the creation order (attention, then
    the caller's post-attention norm, then the MLP) is the seeded initialisation's order."""

    cfg: LayerShape

    def _init_attention(self) -> None:
        c = self.cfg
        h, nh, nkv, hd = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = nn.Linear(h, nh * hd, bias=False)
        self.k_proj = nn.Linear(h, nkv * hd, bias=False)
        self.v_proj = nn.Linear(h, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, h, bias=False)

    def _init_mlp(self) -> None:
        h, inter = self.cfg.hidden_size, self.cfg.intermediate_size
        self.gate_proj = nn.Linear(h, inter, bias=False)
        self.up_proj = nn.Linear(h, inter, bias=False)
        self.down_proj = nn.Linear(inter, h, bias=False)

    def _query(self, a: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:  # [N, heads, D]
        c = self.cfg
        return rotary(self.q_proj(a).view(a.shape[0], c.num_attention_heads, c.head_dim), positions, c.rope_theta)

    def _key_value(self, a: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c, n = self.cfg, a.shape[0]
        k = rotary(self.k_proj(a).view(n, c.num_key_value_heads, c.head_dim), positions, c.rope_theta)
        return k, self.v_proj(a).view(n, c.num_key_value_heads, c.head_dim)  # [N, kv_heads, D] each

    def _attention(self, a, positions, attend) -> torch.Tensor:  # [N, hidden]
        k, v = self._key_value(a, positions)
        return self.o_proj(attend(self._query(a, positions), k, v).reshape(a.shape[0], -1))

    def _mlp(self, m: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(m)) * self.up_proj(m))


def seeded_draft(cls: type[nn.Module], cfg: Any, seed: int, std: float = 0.02) -> nn.Module:
    """cls(cfg) built under `seed`, its weight matrices redrawn N(0, std): every draft kind's
    random initialisation (norm weights stay ones)."""
    torch.manual_seed(seed)
    model = cls(cfg)
    for p in model.parameters():
        if p.ndim == 2:
            nn.init.normal_(p, std=std)
    return model


class SparrowDraftModel(nn.Module, DecoderBody):
    def __init__(self, cfg: SparrowConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        # EAGLE-style fusion of the two inputs; each is normalised first because the target's
        # hidden states and its token embeddings live on very different scales.
        self.embed_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.input_norm = RMSNorm(h, cfg.rms_norm_eps)
        self._init_attention()
        self.post_attn_norm = RMSNorm(h, cfg.rms_norm_eps)
        self._init_mlp()
        # The output is normalised like the target's final hidden states (which vLLM hands the
        # proposer after the final norm), so it feeds the shared LM head and the next step.
        self.final_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, h) if cfg.has_own_embed_tokens else None
        self.lm_head = nn.Linear(h, cfg.vocab_size, bias=False) if cfg.has_own_lm_head else None

    def forward(
        self,
        target_hidden: torch.Tensor,  # [N, hidden] hidden state of a text token (target or draft)
        next_embeds: torch.Tensor,  # [N, hidden] embedding of the token that follows it
        positions: torch.Tensor,  # [N] text-stream index of each entry
        attend: Attend,
    ) -> torch.Tensor:  # [N, hidden] predicted (normalised) hidden state of the next token
        x = self.fc(torch.cat([self.embed_norm(next_embeds), self.hidden_norm(target_hidden)], -1))
        x = x + self._attention(self.input_norm(x), positions, attend)
        x = x + self._mlp(self.post_attn_norm(x))
        return self.final_norm(x)


    def key_values(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys [N, kv_heads, head_dim] (rotated) and values of residual-stream inputs x [N, hidden].

        Training also calls this for IVSB's projected visual states, which enter attention as
        extra keys only (they are never queries and never reach the serve-time cache).
        """
        return self._key_value(self.input_norm(x), positions)


class TokenIO(Protocol):
    """Embedding and LM head the draft uses: the target's, unless the checkpoint has its own."""

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor: ...  # [N] -> [N, hidden]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor: ...  # [N, hidden] -> [N, vocab]


class OwnTokenIO:
    """TokenIO backed by the draft checkpoint's own embedding / LM head, else a fallback."""

    def __init__(self, model: SparrowDraftModel, fallback: TokenIO | None) -> None:
        self.model, self.fallback = model, fallback

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        if self.model.embed_tokens is not None:
            return self.model.embed_tokens(token_ids)
        assert self.fallback is not None, "draft has no embedding and no target was given"
        return self.fallback.embed(token_ids)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.model.lm_head is not None:
            return self.model.lm_head(hidden)
        assert self.fallback is not None, "draft has no LM head and no target was given"
        return self.fallback.logits(hidden)


class TargetTokenIO:
    """The target's embedding and LM head (TP-aware, via vLLM's model interface: the language
    model's embed_input_ids and the model's compute_logits), held weakly: at shutdown vLLM's runner drops the target (runner.shutdown sets model = None) so
    the next engine in the process gets its memory; a strong reference here would keep every
    weight alive (a 7B target on one GPU: the next engine could not start)."""

    def __init__(self, target_model: torch.nn.Module) -> None:
        lm = target_model.get_language_model() if hasattr(target_model, "get_language_model") else target_model
        self._embed = weakref.WeakMethod(lm.embed_input_ids)
        self._logits = weakref.WeakMethod(target_model.compute_logits)

    @staticmethod
    def _live(method: weakref.WeakMethod):
        fn = method()
        if fn is None:
            raise RuntimeError("the target model was released: its engine has shut down")
        return fn

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self._live(self._embed)(token_ids)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._live(self._logits)(hidden)
