"""The draft layer in its serving form: the trained SparrowDraftModel's weights, fused for speed.

Same arithmetic as `SparrowDraftModel.forward` (the training model stays the reference; the
parity test pins serving == training), laid out so a draft forward issues few kernels whatever
the batch size:
- one input norm (training computes it twice: once for the query, once inside `key_values`);
- one merged QKV linear and one merged gate/up linear (5 GEMMs instead of 8);
- RoPE cos/sin read from a table built once for every text index the server can reach
  (training recomputes the frequencies in every call);
- vLLM's fused RMSNorm and SiluAndMul kernels where vLLM provides them (CUDA), torch elsewhere.

Attention is injected as in the training model (`attend(q, k, v)`), so the window cache and its
backends stay outside this file.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from .model import SparrowDraftModel

# attend(q [N, heads, D], k [N, kv_heads, D], v [N, kv_heads, D]) -> [N, heads, D]
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _vllm_fused_ops(device: torch.device):
    """(rms_norm(out, x, weight, eps), silu_and_mul(out, x)) from vLLM's compiled ops, or None."""
    if torch.device(device).type != "cuda":
        return None
    try:
        from vllm import _custom_ops as ops

        return ops.rms_norm, torch.ops._C.silu_and_mul
    except (ImportError, AttributeError, RuntimeError):
        return None


class SparrowServingLayer:
    """Inference-only twin of SparrowDraftModel with fused weights and a RoPE table.

    Built from a model already on its serving device and dtype; holds plain tensors (no
    parameters, no autograd).
    """

    def __init__(self, model: SparrowDraftModel, max_positions: int) -> None:
        cfg = model.cfg
        self.cfg = cfg
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.eps = cfg.rms_norm_eps
        # Weights stored transposed ([in, out], contiguous): x @ W is one op, no transpose view.
        wt = lambda *lins: torch.cat([lin.weight.detach() for lin in lins]).T.contiguous()  # noqa: E731
        self.fc = wt(model.fc)  # [2H, H]
        self.qkv = wt(model.q_proj, model.k_proj, model.v_proj)  # [H, (nh + 2 nkv) * D]
        self.o = wt(model.o_proj)  # [nh * D, H]
        self.gate_up = wt(model.gate_proj, model.up_proj)  # [H, 2I]
        self.down = wt(model.down_proj)  # [I, H]
        self.norms = {name: getattr(model, name).weight.detach() for name in
                      ("embed_norm", "hidden_norm", "input_norm", "post_attn_norm", "final_norm")}
        # RoPE tables over text indices [0, max_positions), fp32, in rotate-half form:
        # rot(x) = x * cos2 + roll(x, D/2) * sin2 with cos2 = (cos | cos), sin2 = (-sin | sin).
        half = cfg.head_dim // 2
        inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, half, dtype=torch.float32) / half))
        angles = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
        cos, sin = angles.cos(), angles.sin()
        self.rope_cos = torch.cat([cos, cos], -1).to(self.qkv.device)  # [P, D]
        self.rope_sin = torch.cat([-sin, sin], -1).to(self.qkv.device)  # [P, D]
        self.max_positions = max_positions
        self._fused = _vllm_fused_ops(self.qkv.device)

    # ---- small ops (fused kernels on CUDA) ---------------------------------------------
    def _norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        weight = self.norms[name]
        if self._fused is not None and x.dtype != torch.float32:
            out = torch.empty_like(x)
            self._fused[0](out, x.contiguous(), weight, self.eps)
            return out
        if x.dtype == torch.float32:  # one aten op
            return nn.functional.rms_norm(x, (x.shape[-1],), weight, self.eps)
        xf = x.float()  # the training model's rounding: normalise in fp32, scale in x's dtype
        return weight * nn.functional.rms_norm(xf, (x.shape[-1],), None, self.eps).to(x.dtype)

    def _silu_mul(self, gu: torch.Tensor) -> torch.Tensor:  # [N, 2I] -> [N, I]
        if self._fused is not None:
            out = gu.new_empty(gu.shape[0], gu.shape[1] // 2)
            self._fused[1](out, gu.contiguous())
            return out
        gate, up = gu.chunk(2, dim=-1)
        return nn.functional.silu(gate) * up

    def _rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Neox RoPE. x [N, heads, D]; positions [N] text indices."""
        cos, sin = self.rope_cos[positions][:, None], self.rope_sin[positions][:, None]  # [N, 1, D]
        xf = x if x.dtype == torch.float32 else x.float()
        out = xf * cos + xf.roll(x.shape[-1] // 2, -1) * sin
        return out if out.dtype == x.dtype else out.to(x.dtype)

    # ---- one forward -------------------------------------------------------------------
    def __call__(
        self,
        target_hidden: torch.Tensor,  # [N, H] a text token's state (target's or the draft's own)
        next_embeds: torch.Tensor,  # [N, H] embedding of the token that follows it
        positions: torch.Tensor,  # [N] text index of each entry (< max_positions)
        attend: Attend,
    ) -> torch.Tensor:  # [N, H] predicted normalised state of the next token
        n, dt = target_hidden.shape[0], next_embeds.dtype
        if target_hidden.dtype != dt:
            target_hidden = target_hidden.to(dt)
        fused_in = torch.cat([self._norm(next_embeds, "embed_norm"), self._norm(target_hidden, "hidden_norm")], -1)
        x = fused_in @ self.fc  # [N, H]
        qkv = self._norm(x, "input_norm") @ self.qkv  # [N, (nh + 2 nkv) * D]
        heads, kv, d = self.heads, self.kv_heads, self.head_dim
        qk = self._rotate(qkv[:, : (heads + kv) * d].view(n, heads + kv, d), positions)
        q, k = qk[:, :heads], qk[:, heads:]  # [N, heads, D], [N, kv, D]
        v = qkv[:, (heads + kv) * d :].view(n, kv, d)
        x = x + attend(q, k, v).reshape(n, -1) @ self.o
        m = self._norm(x, "post_attn_norm")
        x = x + self._silu_mul(m @ self.gate_up) @ self.down
        return self._norm(x, "final_norm")
