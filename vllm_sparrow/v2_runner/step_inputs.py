"""One engine step of vLLM 0.34's Model Runner V2, as the drafter sees it (a StepBatch).

The runner hands propose() its InputBatch and the step's device tensors; nothing is read back
from the device here. Host values are the runner's own host arrays (batch layout, prefill state,
the scheduler's computed counts, an upper bound under async scheduling: what text_bound asks
for) and each prompt's visual placeholder spans, recorded once when the request was added
(prompt_layout.py, as the V1 runner's glue records them). Rows of `last_sampled` and `next_prefill_tokens` are request-state slots
(`idx_mapping`), every other tensor is in batch order.

A worked step (K = 3, two requests): request a decodes with 3 drafts, 1 of them accepted; b
runs a 5-token chunk of its prompt, not its last:
    query_start_loc_np  [0, 4, 9]      rows a: 0..3, b: 4..8
    num_rejected        [2, 0]         -> num_valid [2, 5]
    num_sampled         [2, 0]         -> mid_prefill [False, True]
    next_token          [last_sampled[slot a], next_prefill_tokens[0, slot b]]
"""

from __future__ import annotations

import numpy as np
import torch

from ..drafter import SparrowDrafter, StepBatch
from ..prompt_layout import PromptLayouts


def step_batch(drafter: SparrowDrafter, layouts: PromptLayouts, input_batch, prompt_len_np: np.ndarray,
               hidden: torch.Tensor, num_sampled: torch.Tensor, num_rejected: torch.Tensor,
               last_sampled: torch.Tensor, next_prefill_tokens: torch.Tensor) -> StepBatch:
    """prompt_len_np: [max_num_reqs] host prompt lengths by request-state slot; hidden
    [num_tokens (+ padding), H]; num_sampled, num_rejected [num_reqs]; last_sampled
    [max_num_reqs, 1]; next_prefill_tokens [lookahead, max_num_reqs]."""
    n, T = input_batch.num_reqs, input_batch.num_tokens
    req_ids = list(input_batch.req_ids[:n])
    slots = input_batch.idx_mapping[:n]  # [B] device
    query_start = input_batch.query_start_loc_np[: n + 1].astype(np.int64)  # [B + 1] host
    qsl = input_batch.query_start_loc[: n + 1].long()  # [B + 1] device
    query_lens = qsl[1:] - qsl[:-1]  # [B]
    sampled = num_sampled[:n] > 0  # [B] False: a prompt chunk that is not its last
    prompt = prompt_len_np[input_batch.idx_mapping_np[:n]].astype(np.int64)  # [B] host
    computed = input_batch.num_computed_tokens_np[:n].astype(np.int64)  # [B] host, an upper bound
    qlen = np.diff(query_start)
    decoding = not input_batch.has_prefill
    return StepBatch(
        req_ids=req_ids,
        token_ids=input_batch.input_ids[:T].long(),
        hidden=hidden[:T],
        query_start=query_start,
        num_valid=(query_lens - num_rejected[:n].long()),
        seq_start=(input_batch.seq_lens[:n].long() - query_lens),
        num_prompt_tokens=drafter.to_device(prompt),
        next_token=torch.where(sampled, last_sampled[slots, 0], next_prefill_tokens[0, slots].long()),
        mid_prefill=~sampled,
        decode_only=decoding,
        text_bound=layouts.text_bound(req_ids, computed + qlen, prompt),
        text_rows=None if decoding else layouts.text_rows(req_ids, computed, qlen, prompt),
    )
