"""IVSB, intermediate-layer visual state bridging (training only): the bridge and the policy.

During training the draft also sees visual hidden states from an intermediate target layer
(semantic, with less low-level noise than raw visual embeddings). They are projected into the
draft's residual stream and enter its attention as extra keys/values that text queries may read
(causally: a text token sees the visual tokens before it). They are never queries, carry no
loss, and are absent at inference, where the draft's cache holds text positions only. The bridge
is not exported.

Policy (TrainConfig knobs): `ivsb` on/off; `visual_drop`, the share of samples trained with no
visual states (IVSB dropout: the draft also trains the visual-free path it serves with);
`visual_fraction`, the share of a shown sample's visual tokens (the paper's Table 1 ablation),
drawn each step from the states the capture kept (all of them, or the share `--ivsb-keep` stored:
then `visual_kept` [n_kept] says which visual positions they are).
"""

from __future__ import annotations

import random

import torch
from torch import nn

from ..model import RMSNorm, SparrowDraftModel


class VisualBridge(nn.Module):
    def __init__(self, target_hidden: int, hidden: int, eps: float = 1e-6) -> None:
        super().__init__()
        # The intermediate states are unnormalised (pre final norm): normalise, then project.
        self.norm = RMSNorm(target_hidden, eps)
        self.proj = nn.Linear(target_hidden, hidden, bias=False)

    def forward(self, visual_hidden: torch.Tensor) -> torch.Tensor:  # [V, Ht] -> [V, hidden]
        return self.proj(self.norm(visual_hidden))


def visual_text_positions(is_visual: torch.Tensor) -> torch.Tensor:
    """Text index of each visual token: the number of text tokens before it.  [n] -> [n_vis]"""
    text_before = torch.cumsum((~is_visual).long(), 0) - (~is_visual).long()  # [n]
    return text_before[is_visual]


def pick_visual(n_vis: int, fraction: float, generator: torch.Generator) -> torch.Tensor:
    """Sorted indices of the share `fraction` of visual tokens shown this step (Table 1 ablation)."""
    keep = int(round(fraction * n_vis))
    if keep >= n_vis:
        return torch.arange(n_vis)
    return torch.randperm(n_vis, generator=generator)[:keep].sort().values


def visual_keys(draft: SparrowDraftModel, bridge: VisualBridge, visual_hidden: torch.Tensor,
                positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys/values [V, kv_heads, head_dim] of the projected visual states at their text index."""
    x = bridge(visual_hidden.float())  # [V, hidden]
    return draft.key_values(x, positions)


def visual_shown(cfg, step: int, index: int) -> bool:
    """IVSB dropout: whether this step's sample gets its visual states. A pure function of
    (seed, step, sample), so a resumed run drops the same ones and the shuffling RNG is untouched."""
    return cfg.visual_drop <= 0 or random.Random(f"{cfg.seed}:{step}:{index}").random() >= cfg.visual_drop


def visual_inputs(cfg, draft: SparrowDraftModel, bridge: VisualBridge, sample: dict, generator: torch.Generator,
                  shown: bool):
    """The IVSB keys of one captured sample for this step: (keys [V, kv, D], values, text index
    of each [V]), or None when IVSB is off, the sample is dropped or it has no visual states."""
    visual_hidden = sample["visual_hidden"]
    if not (cfg.ivsb and shown and visual_hidden.shape[0] and cfg.visual_fraction > 0):
        return None
    dev = next(draft.parameters()).device
    keep = pick_visual(visual_hidden.shape[0], cfg.visual_fraction, generator)
    positions = visual_text_positions(sample["is_visual"])  # [n_vis]
    if "visual_kept" in sample:  # a capture that stored a share of the visual states (--ivsb-keep)
        positions = positions[sample["visual_kept"]]
    positions = positions[keep]
    k, v = visual_keys(draft, bridge, visual_hidden[keep].to(dev), positions.to(dev))
    return k, v, positions
