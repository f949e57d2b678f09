"""Where a sampled draft's distribution is kept for Model Runner V2's rejection sampler (a QStore of
drafting/sampling.py): the runner's own DraftLogitsCache [max_num_reqs, K, vocab] in the LM
head's dtype, pre-temperature, from which it verifies with softmax(stored / T). The logits are
rounded into the request's row first and the token is drawn from softmax(rounded / T): with a
bf16 head, q from the unrounded logits would differ from the verifier's by up to ~1% per token.
No vLLM import: the GPU check (gpu_check/) exercises it too.
"""

from __future__ import annotations

import torch

from ..drafting.sampling import softmax_


class LogitRows:
    """Model Runner V2's draft-logits cache (DraftLogitsCache.values) as the store: values [rows, K, vocab] in the head's dtype,
    pre-temperature; `rows` [>= B] the requests' rows in batch order (their request-state slots),
    `columns` a reduced vocabulary's token ids (the other columns are written -inf: q = 0 there)."""

    def __init__(self, values: torch.Tensor, rows: torch.Tensor, columns=None) -> None:
        self.values, self.rows, self.columns = values, rows, columns

    def distribution(self, logits, temperature, is_greedy, position):
        stored = logits.to(self.values.dtype)  # [B, Vd] the values the verifier will read
        rows = self.rows[: stored.shape[0]]  # [B]
        if self.columns is None:
            self.values[rows, position] = stored
        else:
            full = stored.new_full((stored.shape[0], self.values.shape[-1]), float("-inf"))
            self.values[rows, position] = full.index_copy_(1, self.columns, stored)
        return softmax_(stored.to(torch.float32, copy=True).div_(temperature[:, None]))  # the caller's logits untouched

    def kept(self, batch: int, num_draft: int) -> None:
        return None  # the runner reads its own cache
