"""Tree search inside the draft (EAGLE-2 style), handing vLLM its best chain.

vLLM verifies chains only, so the search's product is one chain per request: the path of
depth K with the highest cumulative draft log-probability among the nodes it expanded. With
greedy drafting that chain is a deterministic function of the context, which vLLM's rejection
sampler verifies losslessly at any temperature (a point-mass draft), exactly as it verifies
today's greedy chain. Probabilistic drafting keeps the sampled chain (drafter.py).

The search, per request, level by level (d = depth of the nodes being scored):

    level 1    the root's `topk` best tokens                         -> frontier (width w_1)
    level d    every frontier node's `topk` best children, scored by cumulative log-prob;
               the w_d best of those become the next frontier (one batched draft forward)
    level K    the best child of any frontier node ends the returned path

Widths: `topk` per level while the node budget lasts (budget // topk levels), 1 after that
(the best path so far continues greedily), so a step's cost is fixed by the config.

Branch-private scratch: a branch's own entries (text indices c, c + 1, ... past the committed
end c) are never written to the cache. Each step gathers the slots' committed keys once,
shared by every branch, and keeps each branch's chained keys in columns of its own; when the
frontier is re-chosen the branch columns are reordered by parent. No visual key is read and no
memory is allocated beyond the step's buffers, as for a chain.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from vllm_sparrow_kernels.window_attention_ref import key_visible, ring_stored_index

from ..window import WindowBatch
from .chain import ChainDrafting, kept_drafts
from .step import Committed, DraftCore, Drafts, Plain, Sampler, greedy


@dataclass(frozen=True)
class TreeSpec:
    topk: int  # children scored per expanded node, and nodes expanded per level
    budget: int  # nodes the search may expand per request and step (draft forward rows)

    def widths(self, num_draft: int) -> list[int]:
        """Frontier width of each chained forward (levels 1..K-1)."""
        wide = min(num_draft - 1, self.budget // self.topk)
        return [self.topk] * wide + [1] * (num_draft - 1 - wide)


@dataclass(frozen=True)
class TreeDrafting(Plain):
    """A drafting strategy (drafting/step.py): greedy steps draft the best path of the search; a
    sampled draft keeps the sampled chain (a searched path is not a draw from the draft's q)."""

    spec: TreeSpec
    stop_confidence: float | None = None  # adaptive length's threshold: keep each token's confidence, cut there
    name: str = "tree search"

    def draft(self, drafter: DraftCore, c: Committed, num_draft: int, sample: Sampler = greedy) -> Drafts:
        confidence = self.stop_confidence is not None
        if not sample.is_greedy:
            return ChainDrafting(confidence).draft(drafter, c, num_draft, sample)
        ids, conf = search_chain(drafter, self.spec, c, num_draft)
        return Drafts(ids, confidence=conf if confidence else None)

    def per_request(self, drafts: Drafts) -> list[list[int]] | None:
        if self.stop_confidence is None or drafts.sampled:
            return None
        return kept_drafts(drafts, self.stop_confidence)

    def describe(self) -> dict:
        return {"drafting": self.name, "tree": [self.spec.topk, self.spec.budget],
                "decode_steps": "eager"}


class BranchKeys:
    """Every key the search's forwards read: the slots' committed rows (shared) and each branch's
    own chained entries (private), in one buffer per step.

    Columns: S committed rows, then branch i's C = K - 1 columns at S + i * C. A forward at
    level d writes branch i's key into column S + i * C + d - 1; re-choosing the frontier
    copies the parents' columns (C per branch) into the new branches' places.
    """

    def __init__(self, cache, slots, c_new, rows: int | None, width: int, num_draft: int, dtype) -> None:
        B = slots.shape[0]
        S = cache.capacity if rows is None else min(rows, cache.capacity)
        C = max(num_draft - 1, 1)
        kc = cache.k[:, :, :S].index_select(0, slots)  # [B, kv, S, D] the committed entries
        vc = cache.v[:, :, :S].index_select(0, slots)
        pad = kc.new_zeros(B, kc.shape[1], width * C, kc.shape[3])
        self.keys = torch.cat([kc, pad], 2).to(dtype)  # [B, kv, S + width * C, D]
        self.values = torch.cat([vc, pad], 2).to(dtype)
        self.S, self.C, self.width = S, C, width
        self.A, self.W = cache.anchors, cache.spec.window or 0
        self.stored = ring_stored_index(c_new, cache.anchors, cache.ring, S)  # [B, S]
        self.c_new = c_new  # [B]
        self.iota = torch.arange(C, device=slots.device)

    def reorder(self, parent: torch.Tensor) -> None:
        """New branch i continues old branch parent[:, i] (parent [B, w'] with w' <= width)."""
        B, kv, _, D = self.keys.shape
        w = parent.shape[1]
        for buf in (self.keys, self.values):
            own = buf[:, :, self.S :].view(B, kv, self.width, self.C, D)
            picked = own.gather(2, parent[:, None, :, None, None].expand(B, kv, w, self.C, D))
            own[:, :, :w] = picked

    def attend(self, level: int, q, k, v) -> torch.Tensor:
        """Level `level` (1-based) of the search: q [B, w, heads, D], k/v [B, w, kv, D] of the w
        frontier branches, all at text index c_new + level - 1. Returns [B, w, heads, D]."""
        B, w = q.shape[:2]
        col = self.S + torch.arange(w, device=q.device) * self.C + level - 1  # [w]
        self.keys[:, :, col] = k.transpose(1, 2).to(self.keys.dtype)
        self.values[:, :, col] = v.transpose(1, 2).to(self.values.dtype)
        pos = (self.c_new + level - 1)[:, None]  # [B, 1]
        shared = key_visible(self.stored, pos, self.A, self.W)[:, 0]  # [B, S]
        # Branch j's entries at text indices c_new .. c_new + level - 1, visible to branch j only.
        own_idx = self.c_new[:, None] + self.iota  # [B, C]
        own = key_visible(own_idx, pos, self.A, self.W)[:, 0]  # [B, C] (columns >= level: not yet)
        eye = torch.eye(self.width, dtype=torch.bool, device=q.device)[:w]  # [w, width]
        branch = eye[None, :, :, None] & own[:, None, None, :]  # [B, w, width, C]
        mask = torch.cat([shared[:, None].expand(B, w, self.S), branch.flatten(2)], 2)  # [B, w, S + width * C]
        out = F.scaled_dot_product_attention(q.transpose(1, 2), self.keys, self.values, attn_mask=mask[:, None],
                                             scale=q.shape[-1] ** -0.5, enable_gqa=q.shape[2] != k.shape[2])
        return out.transpose(1, 2)  # [B, w, heads, D]


def search_chain(drafter: DraftCore, spec: TreeSpec, committed: Committed, num_draft: int):
    """The best path of depth K = num_draft per request (ids [B, K]) and, per position, the
    drafted token's probability under the draft [B, K] (for adaptive length), from what the
    commit left (committed.state [B, H] drafts the first token; requests not drafting get zeros).

    Worked example, one request, topk 2, K 3 (log-probabilities in brackets):
      root          top-2: a (-0.1), b (-2.0)                      frontier [a, b]
      level 1       a -> c (-0.2), d (-0.3);  b -> e (-0.05), f (-0.9)
                    cand = [ac -0.3, ad -0.4, be -2.05, bf -2.9];  keep = [0, 1]
                    parent = keep // 2 = [0, 0]: both new branches continue a, so a's key
                    columns are copied into both places (BranchKeys.reorder)   frontier [ac, ad]
      level 2       best child of each: ac -> g (-0.5): -0.8;  ad -> h (-0.1): -0.5
      chain         a d h (the greedy chain would have been a c g)
    """
    y, slots, c_new, drafting = committed.state, committed.slots, committed.committed, committed.drafting
    B, K = y.shape[0], num_draft
    widths = spec.widths(K)  # [K - 1] frontier width at depths 1..K-1
    ids_of = (lambda col: drafter.vocab_ids[col]) if drafter.vocab_ids is not None else (lambda col: col)
    logp = drafter.io.logits(y).float().log_softmax(-1)  # [B, V]
    score, col = logp.topk(widths[0] if widths else 1, -1)  # [B, w] the depth-1 frontier
    paths, cum = col[:, :, None], score[:, :, None]  # [B, w, depth] each node's path, prefix scores
    parent_states = y[:, None].repeat(1, score.shape[1], 1)  # [B, w, H]
    keys = BranchKeys(drafter.cache, slots, c_new, committed.rows, widths[0], K, y.dtype) if widths else None
    for level in range(1, K):
        # The frontier (depth `level`) through one draft forward: every node at text index
        # c_new + level - 1, reading the committed keys and its own branch's.
        w = paths.shape[1]
        wb = WindowBatch(slots, (c_new + level - 1)[:, None].repeat(1, w), drafting[:, None].expand(B, w), c_new)
        states = drafter.forward(parent_states.reshape(B * w, -1), ids_of(paths[:, :, -1]), wb,
                                 lambda q, k, v, lv=level: keys.attend(lv, q, k, v)).view(B, w, -1)
        # Score the children; the best w_next of them form the next frontier (1: only the best
        # child of each node can win, so one child each is scored).
        w_next = widths[level] if level < K - 1 else 1
        k = spec.topk if w_next > 1 else 1
        logits = drafter.io.logits(states.view(B * w, -1)).float().view(B, w, -1)  # [B, w, V]
        lp, child = logits.log_softmax(-1).topk(k, -1)  # [B, w, k]
        cand = (score[:, :, None] + lp).flatten(1)  # [B, w * k]
        keep = cand.topk(w_next, -1).indices  # [B, w_next]
        parent = torch.div(keep, k, rounding_mode="floor")  # [B, w_next] frontier node each continues
        score = cand.gather(1, keep)

        def pick(t):  # rows of t [B, w, n] for the new frontier's parents
            return t.gather(1, parent[:, :, None].expand(B, parent.shape[1], t.shape[2]))

        paths = torch.cat([pick(paths), child.flatten(1).gather(1, keep)[:, :, None]], 2)
        cum = torch.cat([pick(cum), score[:, :, None]], 2)
        parent_states = pick(states)
        if level < K - 1:
            keys.reorder(parent)
    best = score.argmax(-1)  # [B]
    ar = torch.arange(B, device=y.device)
    chain, chain_cum = paths[ar, best], cum[ar, best]  # [B, K]
    conf = torch.cat([chain_cum[:, :1], chain_cum.diff(dim=1)], 1).exp()  # [B, K]
    return torch.where(drafting[:, None], ids_of(chain), 0), conf
