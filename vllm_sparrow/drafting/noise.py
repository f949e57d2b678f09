"""The noise a sampled draft is drawn with (drafting/sampling.py's exponential race), keyed by
request: RequestNoise's draw for request b at chained position j is a function of (b's seed, b's
sequence position + j, the vocabulary column) alone, so a request with a seed drafts the same
tokens on every run, whatever shares its steps, and vLLM's seeded verification then repeats its
output (vLLM 0.34 draws its own drafts so, from a counter-based hash of seed and position).
Without it the draft draws from the engine's generator, whose stream depends on every request
the engine ran before.

The hash and its two implementations are kernels/request_noise_ref.py (torch: the CPU path) and
kernels/request_noise.py (Triton, one launch per drafted position: the CUDA path).
"""

from __future__ import annotations

import torch
from vllm_sparrow_kernels.request_noise_ref import exponential_noise_ref, row_keys


class RequestNoise:
    """Exp(1) noise per request: seeds [B] int64 (vLLM's per-request sampling seeds), positions
    [B] int64 (each request's sequence position at chained position 0). Position j of the chain
    is keyed by positions + j."""

    def __init__(self, seeds: torch.Tensor, positions: torch.Tensor) -> None:
        self.seeds, self.positions = seeds.to(torch.int64), positions.to(torch.int64)

    def exponential(self, like: torch.Tensor, position: int) -> torch.Tensor:
        """Noise [B, V] float32 for chained position `position`, shaped like `like`."""
        keys = row_keys(self.seeds[: like.shape[0]], self.positions[: like.shape[0]] + position)  # [B] int32
        out = torch.empty(like.shape, dtype=torch.float32, device=like.device)
        if out.is_cuda:
            from vllm_sparrow_kernels.request_noise import exponential_noise

            return exponential_noise(keys, out)
        return exponential_noise_ref(keys, out)
