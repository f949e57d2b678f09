"""A 7B-shaped target's verify step with random weights: what a draft step is measured against.

The verify step vLLM runs for B requests each verifying L - 1 drafts: B x L tokens through
every layer (RMSNorm, QKV, RoPE, attention over the request's KV cache of `context` tokens,
output projection, gated MLP), the final norm and the LM head over every row. Attention is
torch's SDPA (flash where it takes the shapes) without a mask: the K + 1 queries read the
whole cache, the same bytes as the causal verify. Like vLLM's decode steps it is captured in a
CUDA graph when it can be (else timed eagerly, and the report says so).

KV caches: one per layer when all of them fit in `kv_budget_bytes`; beyond that every layer
reads one shared cache, which moves the same bytes per layer (a layer's cache at those sizes is
gigabytes, far beyond the 60 MB L2, so nothing is served from cache) and keeps the check inside
one GPU. The report says which.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..model import rotary
from .shapes import CheckShapes
from .timer import measure_ms


class RandomTarget:
    def __init__(self, s: CheckShapes, device: torch.device, seed: int = 3) -> None:
        self.s, self.device = s, device
        g = torch.Generator(device=device).manual_seed(seed)
        w = lambda i, o: (torch.randn(i, o, generator=g, device=device) * i ** -0.5).to(s.dtype)  # noqa: E731
        qkv = (s.heads + 2 * s.kv_heads) * s.head_dim
        self.layers = [dict(qkv=w(s.hidden, qkv), o=w(s.heads * s.head_dim, s.hidden),
                            gate_up=w(s.hidden, 2 * s.intermediate), down=w(s.intermediate, s.hidden))
                       for _ in range(s.target_layers)]
        self.embed = w(s.vocab, s.hidden)
        self.head = w(s.hidden, s.vocab)  # [hidden, vocab]
        self.norm = torch.ones(s.hidden, dtype=s.dtype, device=device)

    def caches(self, B: int, context: int, kv_budget_bytes: int) -> tuple[list, bool]:
        """Per-layer (k, v) caches [B, kv_heads, context, D], shared when they would not fit."""
        s = self.s
        shape = (B, s.kv_heads, context, s.head_dim)
        per_layer = 2 * torch.Size(shape).numel() * torch.empty((), dtype=s.dtype).element_size()
        shared = per_layer * s.target_layers > kv_budget_bytes
        made = 1 if shared else s.target_layers
        kv = [(torch.randn(shape, device=self.device).to(s.dtype), torch.randn(shape, device=self.device).to(s.dtype))
              for _ in range(made)]
        return kv * s.target_layers if shared else kv, shared

    def step(self, ids: torch.Tensor, positions: torch.Tensor, kv: list, B: int) -> torch.Tensor:
        """ids, positions [B * L] -> logits [B * L, vocab]; writes the rows' keys at the cache's end."""
        s = self.s
        L = ids.shape[0] // B
        x = self.embed[ids]  # [B * L, hidden]
        for layer, (kc, vc) in zip(self.layers, kv):
            a = F.rms_norm(x, (s.hidden,), self.norm)
            q, k, v = (a @ layer["qkv"]).split([s.heads * s.head_dim, s.kv_heads * s.head_dim,
                                                 s.kv_heads * s.head_dim], -1)
            q = rotary(q.view(-1, s.heads, s.head_dim), positions, 1e6)
            k = rotary(k.view(-1, s.kv_heads, s.head_dim), positions, 1e6)
            kc[:, :, -L:] = k.view(B, L, s.kv_heads, s.head_dim).transpose(1, 2)
            vc[:, :, -L:] = v.view(B, L, s.kv_heads, s.head_dim).transpose(1, 2)
            o = F.scaled_dot_product_attention(q.view(B, L, s.heads, s.head_dim).transpose(1, 2), kc, vc,
                                               enable_gqa=True)  # [B, heads, L, D]
            x = x + o.transpose(1, 2).reshape(B * L, -1) @ layer["o"]
            gate, up = (F.rms_norm(x, (s.hidden,), self.norm) @ layer["gate_up"]).chunk(2, -1)
            x = x + (F.silu(gate) * up) @ layer["down"]
        return F.rms_norm(x, (s.hidden,), self.norm) @ self.head


def time_step(target: RandomTarget, B: int, context: int, L: int, repeats: int, kv_budget_bytes: int,
              kv=None) -> dict:
    """Milliseconds of one verify step of B requests, L rows each, at `context` cached tokens
    each (`kv`: caches from target.caches(B, context, ...) to reuse across L)."""
    s, dev = target.s, target.device
    kv, shared = kv if kv is not None else target.caches(B, context, kv_budget_bytes)
    ids = torch.randint(0, s.vocab, (B * L,), device=dev)
    positions = (context - L + torch.arange(L, device=dev)).repeat(B)
    run = lambda: target.step(ids, positions, kv, B)  # noqa: E731
    attention = flash_or_default(run)
    graphed, error = False, None
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]) if attention == "flash" else nullcontext():
        if dev.type == "cuda":
            try:
                run = _captured(run)
                graphed = True
            except RuntimeError as e:  # a kernel that cannot be captured: timed eagerly
                error = f"{type(e).__name__}: {str(e)[:200]}"
        ms = measure_ms(run, dev, repeats)
    return {"batch": B, "context": context, "rows": L, "target_ms": ms, "cuda_graph": graphed, "attention": attention,
            "kv_shared_across_layers": shared, **({"graph_error": error} if error else {})}


def flash_or_default(run) -> str:
    """'flash' when SDPA's flash kernel takes the step (GQA, the dtype, the device), else what
    runs instead, with flash's refusal (a slower attention would flatter the draft's ratio)."""
    try:
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            run()
        return "flash"
    except RuntimeError as e:
        return f"torch default (flash refused: {str(e).splitlines()[0][:160]})"


def _captured(fn):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay
