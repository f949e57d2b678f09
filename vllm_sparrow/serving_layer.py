"""The draft layer in its serving form: the trained SparrowDraftModel's weights, fused for speed.

Same arithmetic as `SparrowDraftModel.forward` (the training model stays the reference; the
parity test pins serving == training), laid out so a draft forward issues few kernels whatever
the batch size:
- one input norm (training computes it twice: once for the query, once inside `key_values`);
- one merged QKV linear and one merged gate/up linear (5 GEMMs instead of 8);
- RoPE cos/sin read from a table built once for every text index the server can reach
  (training recomputes the frequencies in every call);
- vLLM's compiled RMSNorm (with the residual add fused in), RoPE and (CUDA) SiluAndMul ops
  where vLLM's build has them (its CUDA and CPU builds do; on CPU torch's RMSNorm is a
  composite of six ops, vLLM's one), torch elsewhere (e.g. the meta device).

Attention is injected as in the training model (`attend(q, k, v)`), so the window cache and its
backends stay outside this file. The forward is also offered in two halves, `project` (every
entry's residual, q, k, v) and `finish` (attention output -> next state), for steps that store
many entries but read the output of few.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from .model import SparrowDraftModel

# attend(q [N, heads, D], k [N, kv_heads, D], v [N, kv_heads, D]) -> [N, heads, D]
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class _VllmOps:
    """vLLM's compiled kernels this layer uses, or None where the build or device lacks them."""

    def __init__(self, device: torch.device) -> None:
        from vllm import _custom_ops as ops

        torch.ops._C.rms_norm  # noqa: B018 - the compiled extension loaded (an AttributeError if it did not)
        self.rms_norm = ops.rms_norm  # (out, x, weight, eps)
        self.fused_add_rms_norm = ops.fused_add_rms_norm  # (x, residual, weight, eps), in place
        self.rotary = ops.rotary_embedding  # (positions, q, k, head_dim, cos_sin, is_neox), in place
        # On CPU vLLM's SiluAndMul loses to torch's two ops above a few rows (measured).
        self.silu_and_mul = torch.ops._C.silu_and_mul if device.type == "cuda" else None
        self._onednn = device.type == "cpu" and getattr(ops, "_supports_onednn", False)
        self._ops = ops

    def onednn_linear(self, w_t: torch.Tensor):
        """x [N, in] -> x @ w_t through a oneDNN handle prepacked once (CPU), or None."""
        if not self._onednn or w_t.dtype not in (torch.float32, torch.bfloat16):
            return None
        try:
            handle = self._ops.create_onednn_mm(w_t, 32)
        except RuntimeError:
            return None
        return lambda x: self._ops.onednn_mm(handle, x.contiguous(), None)

    @classmethod
    def load(cls, device: torch.device) -> _VllmOps | None:
        if torch.device(device).type not in ("cuda", "cpu"):
            return None
        try:
            return cls(torch.device(device))
        except (ImportError, AttributeError, RuntimeError):
            return None


class _Linear:
    """x @ W with W stored [in, out]; on CPU, vLLM's prepacked oneDNN GEMM (what vLLM's own CPU
    linears run) from 4 rows up, where it beats aten's by about 2x; aten's below (measured)."""

    ONEDNN_MIN_ROWS = 4

    def __init__(self, w_t: torch.Tensor, ops: _VllmOps | None) -> None:
        self.w_t = w_t  # [in, out]
        self.onednn = ops.onednn_linear(w_t) if ops is not None else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [N, in] -> [N, out]
        if self.onednn is not None and x.shape[0] >= self.ONEDNN_MIN_ROWS:
            return self.onednn(x)
        return x @ self.w_t


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
        device = model.fc.weight.device
        self._ops = _VllmOps.load(device)
        self.fc = _Linear(wt(model.fc), self._ops)  # [2H, H]
        self.qkv = _Linear(wt(model.q_proj, model.k_proj, model.v_proj), self._ops)  # [H, (nh + 2 nkv) * D]
        self.o = _Linear(wt(model.o_proj), self._ops)  # [nh * D, H]
        self.gate_up = _Linear(wt(model.gate_proj, model.up_proj), self._ops)  # [H, 2I]
        self.down = _Linear(wt(model.down_proj), self._ops)  # [I, H]
        self.norms = {name: getattr(model, name).weight.detach() for name in
                      ("embed_norm", "hidden_norm", "input_norm", "post_attn_norm", "final_norm")}
        # RoPE tables over text indices [0, max_positions), fp32, in rotate-half form:
        # rot(x) = x * cos2 + roll(x, D/2) * sin2 with cos2 = (cos | cos), sin2 = (-sin | sin).
        half = cfg.head_dim // 2
        inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, half, dtype=torch.float32) / half))
        angles = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
        cos, sin = angles.cos(), angles.sin()
        self.rope_cos = torch.cat([cos, cos], -1).to(device)  # [P, D]
        self.rope_sin = torch.cat([-sin, sin], -1).to(device)  # [P, D]
        self.max_positions = max_positions
        # vLLM's RoPE op reads (cos | sin) [P, D] in the activations' dtype (rotates in place).
        self.cos_sin = torch.cat([cos, sin], -1).to(device, model.fc.weight.dtype)

    # ---- small ops (fused kernels on CUDA) ---------------------------------------------
    def _norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        weight = self.norms[name]
        if self._ops is not None:
            out = torch.empty_like(x)
            self._ops.rms_norm(out, x, weight, self.eps)
            return out
        if x.dtype == torch.float32:  # one aten op
            return nn.functional.rms_norm(x, (x.shape[-1],), weight, self.eps)
        xf = x.float()  # the training model's rounding: normalise in fp32, scale in x's dtype
        return weight * nn.functional.rms_norm(xf, (x.shape[-1],), None, self.eps).to(x.dtype)

    def _add_norm(self, x: torch.Tensor, residual: torch.Tensor, name: str) -> torch.Tensor:
        """norm(x + residual), and residual += x (both [N, H], fresh tensors of this forward)."""
        if self._ops is not None:
            self._ops.fused_add_rms_norm(x, residual, self.norms[name], self.eps)
            return x
        residual += x
        return self._norm(residual, name)

    def _silu_mul(self, gu: torch.Tensor) -> torch.Tensor:  # [N, 2I] -> [N, I]
        if self._ops is not None and self._ops.silu_and_mul is not None:
            out = gu.new_empty(gu.shape[0], gu.shape[1] // 2)
            self._ops.silu_and_mul(out, gu)
            return out
        gate, up = gu.chunk(2, dim=-1)
        return nn.functional.silu(gate) * up

    def _rotate_qk(self, qkv: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Neox RoPE of the q and k parts of qkv [N, (nh + 2 nkv) * D] -> q [N, nh, D], k [N, nkv, D]."""
        n, heads, kv, d = qkv.shape[0], self.heads, self.kv_heads, self.head_dim
        if self._ops is not None:  # one op, in place on the fresh qkv
            self._ops.rotary(positions, qkv[:, : heads * d], qkv[:, heads * d : (heads + kv) * d], d,
                             self.cos_sin, True)
            return qkv[:, : heads * d].view(n, heads, d), qkv[:, heads * d : (heads + kv) * d].view(n, kv, d)
        qk = self._rotate(qkv[:, : (heads + kv) * d].view(n, heads + kv, d), positions)
        return qk[:, :heads], qk[:, heads:]

    def _rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Neox RoPE in torch. x [N, heads, D]; positions [N] text indices."""
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
        x, q, k, v = self.project(target_hidden, next_embeds, positions)
        return self.finish(x, attend(q, k, v))

    def project(self, target_hidden: torch.Tensor, next_embeds: torch.Tensor, positions: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The forward up to attention: residual x [N, H] and the rotated q [N, heads, D], k and
        v [N, kv_heads, D] of every entry (what the cache stores)."""
        n, dt = target_hidden.shape[0], next_embeds.dtype
        if target_hidden.dtype != dt:
            target_hidden = target_hidden.to(dt)
        # vLLM's compiled ops read raw dense memory: a broadcast view (stride 0) would be read
        # past its end. No copy when the inputs are dense already.
        target_hidden, positions = target_hidden.contiguous(), positions.contiguous()
        fused_in = torch.cat([self._norm(next_embeds, "embed_norm"), self._norm(target_hidden, "hidden_norm")], -1)
        x = self.fc(fused_in)  # [N, H]
        qkv = self.qkv(self._norm(x, "input_norm"))  # [N, (nh + 2 nkv) * D]
        q, k = self._rotate_qk(qkv, positions)  # [N, heads, D], [N, kv, D]
        kv, d = self.kv_heads, self.head_dim
        return x, q, k, qkv[:, (self.heads + kv) * d :].view(n, kv, d)

    def finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """The forward after attention, for the rows whose output is read: x [n, H] (their
        residuals from project) and attn [n, heads, D] -> [n, H]."""
        m = self._add_norm(self.o(attn.reshape(x.shape[0], -1)), x, "post_attn_norm")  # x += attn
        return self._add_norm(self.down(self._silu_mul(self.gate_up(m))), x, "final_norm")
