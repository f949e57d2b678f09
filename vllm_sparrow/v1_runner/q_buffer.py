"""Where a sampled draft's distribution is kept for the V1 runner's rejection sampler (a QStore of
drafting/sampling.py): [max_num_seqs, K, vocab] float32, taken by the runner after propose()
(take_last_draft_probs). Allocated once, when the draft loads, so vLLM's memory profile counts it
(vLLM's own EAGLE stacks its probabilities per step, outside the profile); each position's q is
computed in place in its [B, vocab] slice. No vLLM import: the GPU check (gpu_check/) sizes it too.
"""

from __future__ import annotations

import torch

from ..drafting.sampling import softmax_


class QBuffer:
    """q of every sampled draft of a step, as vLLM's V1 runner takes it: [max_requests, K, vocab]
    float32, allocated once. Columns outside a reduced draft vocabulary (`columns`: draft column
    -> token id) stay zero: q = 0 there, which rejection sampling handles like any q."""

    def __init__(self, max_requests: int, num_draft: int, vocab_size: int, device, columns=None) -> None:
        self.q = torch.zeros(max_requests, num_draft, vocab_size, dtype=torch.float32, device=device)
        self.columns = columns  # [Vd] or None (full vocabulary)

    @staticmethod
    def bytes_needed(max_requests: int, num_draft: int, vocab_size: int) -> int:
        return 4 * max_requests * num_draft * vocab_size

    def distribution(self, logits, temperature, is_greedy, position):
        B = logits.shape[0]
        if self.columns is None:  # computed in place in the step's slice
            if logits.shape[-1] != self.q.shape[-1]:
                raise ValueError(f"draft logits have {logits.shape[-1]} columns, the q buffer {self.q.shape[-1]}: "
                                 "size it by the vocabulary the draft's LM head produces")
            q = self.q[:B, position]  # [B, vocab] a view
            q.copy_(logits)
            return softmax_(q.div_(temperature[:, None]))
        q = softmax_(logits.to(torch.float32, copy=True).div_(temperature[:, None]))  # [B, Vd]
        self.q[:B, position].index_copy_(1, self.columns, q)
        return q

    def kept(self, batch: int, num_draft: int) -> torch.Tensor:
        """[B, K, vocab]: the step's q for the runner (a view: no copy)."""
        return self.q[:batch, :num_draft]
