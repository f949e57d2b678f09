"""The training objective: stage 1 (target states in) and MTP stages (the draft's own states in).

Text stream of one sample: tokens x[0..m-1], target final states h[0..m-1]. Entry t pairs h[t]
with the embedding of x[t+1] and predicts x[t+2] and the state h[t+1] (what serving does).

Stage s >= 1 replays inference after s chained drafts: entry t takes the draft's own stage-(s-1)
prediction for position t (made by entry t-1) in place of h[t], and attends, exactly as at
serve time, to stage-0 keys of committed positions <= t-s (under the anchor + window rule) and
to the chain's own keys at positions t-s+1..t, one from each stage 1..s. Losses of all stages
are joined with weights. IVSB visual keys (ivsb.py) are visible to every stage.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..model import SparrowDraftModel
from ..window import WindowSpec


@dataclass
class StageResult:
    loss: torch.Tensor  # scalar, mean over the stage's scored entries
    correct: int  # top-1 agreement with the target's next token
    scored: int
    outputs: torch.Tensor | None = None  # [n, H] the stage's predictions (tests, analysis)


def stage_masks(n: int, stage: int, spec: WindowSpec) -> list[torch.Tensor]:
    """For stage s, one [n, n] mask per key block: stage-0 keys, then stages 1..s."""
    q = torch.arange(n)
    base = spec.mask(q, q) & (q[None, :] <= (q[:, None] - stage))  # committed keys only
    chain = [q[None, :] == (q[:, None] - stage + j) for j in range(1, stage + 1)]
    return [base] + chain


def _attend_fn(masks: list[torch.Tensor], keys: list[tuple[torch.Tensor, torch.Tensor]],
               vis: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None):
    """attend() over [visual keys ; earlier-stage keys ; this stage's keys] with one mask."""

    def attend(q, k, v):  # q [n, heads, d], k/v [n, kv, d]
        ks = [kk for kk, _ in keys] + [k]
        vs = [vv for _, vv in keys] + [v]
        mask = torch.cat(masks, 1)  # [n, n * (stages)]
        if vis is not None:
            vk, vv, vmask = vis
            ks, vs, mask = [vk] + ks, [vv] + vs, torch.cat([vmask, mask], 1)
        kk, vv = torch.cat(ks), torch.cat(vs)  # [keys, kv, d]
        g = q.shape[1] // kk.shape[1]
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1), kk.repeat_interleave(g, 1).transpose(0, 1),
            vv.repeat_interleave(g, 1).transpose(0, 1), attn_mask=mask.to(q.device))
        return out.transpose(0, 1)

    return attend


def unrolled_stages(draft: SparrowDraftModel, io, tokens: torch.Tensor, hidden: torch.Tensor,
                    scored: torch.Tensor, mtp_steps: int, hidden_loss_weight: float,
                    visual: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                    return_outputs: bool = False, rope_positions: torch.Tensor | None = None
                    ) -> list[StageResult]:
    """Stages 0..mtp_steps on one text stream.

    tokens [m], hidden [m, H]; scored [m-2] bool: entries whose prediction counts (response
    tokens); visual: (keys [V, kv, d], values, text index of each [V]) or None;
    rope_positions [m]: rotary position of each token (default: its index, Sparrow's text
    index). A chained entry at stage s sits s positions past its committed entry.
    """
    n = tokens.shape[0] - 2
    spec = WindowSpec(draft.cfg.anchor_tokens, draft.cfg.window_tokens)
    pos = torch.arange(n, device=hidden.device)
    emb = io.embed(tokens[1 : n + 1]).detach()  # [n, H] embedding of x[t+1]
    labels, state_targets = tokens[2 : n + 2], hidden[1 : n + 1]  # [n], [n, H]
    vis = None
    if visual is not None and visual[0].shape[0]:
        vk, vv, vpos = visual
        vis = (vk, vv, vpos[None, :] <= pos[:, None].cpu())  # [n, V] causal in text index
    results, keys, inputs = [], [], hidden[:n]
    for stage in range(mtp_steps + 1):
        masks = stage_masks(n, stage, spec)
        cache = {}

        def attend(q, k, v, _m=masks):
            cache["kv"] = (k, v)
            return _attend_fn(_m, keys, vis)(q, k, v)

        rope = pos if rope_positions is None else rope_positions[:n].to(pos.device)
        if stage and rope_positions is not None:  # serving: chain position = committed + s
            rope = torch.cat([rope[:stage], rope[: n - stage] + stage])
        y = draft(inputs, emb, rope, attend)  # [n, H]
        keys.append(cache["kv"])
        valid = scored & (pos >= stage)  # entry t has a stage-s input only for t >= s
        results.append(_stage_loss(io, y, labels, state_targets, valid, hidden_loss_weight))
        if return_outputs:
            results[-1].outputs = y
        # Next stage: entry t reads the draft's prediction for position t (made by entry t-1).
        inputs = torch.cat([hidden[:1], y[:-1]])
    return results


def _stage_loss(io, y, labels, state_targets, valid, hidden_loss_weight) -> StageResult:
    if not bool(valid.any()):
        return StageResult(y.sum() * 0.0, 0, 0)
    logits = io.logits(y[valid])  # [v, vocab]
    loss = F.cross_entropy(logits, labels[valid])
    loss = loss + hidden_loss_weight * F.smooth_l1_loss(y[valid], state_targets[valid])
    correct = int((logits.argmax(-1) == labels[valid]).sum())
    return StageResult(loss, correct, int(valid.sum()))
