"""The training objective: stage 1 (target states in) and MTP stages (the draft's own states in).

Text stream of one sample: tokens x[0..m-1], target final states h[0..m-1]. Entry t pairs h[t]
with the embedding of x[t+1] and predicts x[t+2] and the state h[t+1] (what serving does).

Stage s >= 1 replays inference after s chained drafts: entry t takes the draft's own stage-(s-1)
prediction for position t (made by entry t-1) in place of h[t], and attends, exactly as at
serve time, to stage-0 keys of committed positions <= t-s (under the anchor + window rule) and
to the chain's own keys at positions t-s+1..t, one from each stage 1..s. Losses of all stages
are joined with weights. IVSB visual keys (ivsb.py) are visible to every stage.

Only entries from `first - mtp_steps` on are attended (first: the first entry whose output counts),
which is exact for entries >= first: stage s at entry t reads stage i < s outputs of entries
>= t - s only (its input y_{s-1}[t-1]; its chain keys at t-s+1..t, made from y_{j-1}[t-s+j-1]).
Worked example, mtp_steps 2, a 25,000-position EAGLE stream whose response starts at entry
24,700: queries are entries 24,698..24,999 (302 rows) against all 25,000 stage-0 keys and
302 keys per chain block, so stage 2's masks are [302, 25,604] rather than [25,000, 75,000]
(1.9 GB of mask, and 30 GB of float32 attention weights over 4 heads): the visual-KV
baselines train on long videos too (tests/test_visual_kv_baselines_train_on_long_videos.py).
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


def stage_masks(n: int, stage: int, spec: WindowSpec, first: int = 0) -> list[torch.Tensor]:
    """For stage s, one mask per key block, queries entries first..n-1: stage-0 keys (every
    entry: [n - first, n]), then stages 1..s (entries first..n-1 only: [n - first, n - first],
    as a query's chain keys are at most s entries behind it)."""
    q, k = torch.arange(first, n), torch.arange(n)
    base = spec.mask(q, k) & (k[None, :] <= (q[:, None] - stage))  # committed keys only
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
                    return_outputs: bool = False, rope_positions: torch.Tensor | None = None,
                    first_entry: int | None = None) -> list[StageResult]:
    """Stages 0..mtp_steps on one text stream.

    tokens [m], hidden [m, H]; scored [m-2] bool: entries whose prediction counts (response
    tokens); visual: (keys [V, kv, d], values, text index of each [V]) or None;
    rope_positions [m]: rotary position of each token (default: its index, Sparrow's text
    index). A chained entry at stage s sits s positions past its committed entry.
    first_entry: outputs of earlier entries are not computed (see the module docstring); None:
    the first scored entry, or 0 when return_outputs.
    """
    n = tokens.shape[0] - 2
    if first_entry is None:
        first_entry = 0 if return_outputs or not bool(scored.any()) else int(scored.nonzero()[0, 0])
    if bool(scored[:first_entry].any()):
        raise ValueError(f"scored entries before first_entry {first_entry}: their outputs are not computed")
    lo = max(0, min(first_entry, n) - mtp_steps)  # first attended entry
    spec = WindowSpec(draft.cfg.anchor_tokens, draft.cfg.window_tokens)
    pos = torch.arange(n, device=hidden.device)
    emb = io.embed(tokens[1 : n + 1]).detach()  # [n, H] embedding of x[t+1]
    labels, state_targets = tokens[2 : n + 2], hidden[1 : n + 1]  # [n], [n, H]
    vis = None
    if visual is not None and visual[0].shape[0]:
        vk, vv, vpos = visual
        vis = (vk, vv, vpos[None, :] <= pos[lo:, None].cpu())  # [n - lo, V] causal in text index
    results, keys, inputs = [], [], hidden[:n]
    for stage in range(mtp_steps + 1):
        masks = stage_masks(n, stage, spec, lo)
        cache = {}

        def attend(q, k, v, _m=masks, _s=stage):  # q [n, heads, d]: rows before lo are left zero
            if _s:  # a chain block: keys of entries lo.. only
                k, v = k[lo:], v[lo:]
            cache["kv"] = (k, v)
            out = _attend_fn(_m, keys, vis)(q[lo:], k, v)  # [n - lo, heads, d]
            return out if lo == 0 else torch.cat([out.new_zeros((lo, *out.shape[1:])), out])

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
