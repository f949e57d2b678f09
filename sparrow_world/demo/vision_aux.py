"""Dense supervision that teaches the demo target's vision tower to see shapes, sizes and motions.

Why: trained on captions alone, the tiny tower learned colours and nothing else. Probes on its
merged visual tokens read the colour of the object under a token (0.85) but not its shape (0.28,
below the 0.32 majority guess) nor its motion (0.20), and its captions got shapes, sizes and
motions no better than with a blank video. The caption loss reaches the tower only through the
LM's attention, where "which colours are there" is learned first and is enough to push the loss
down; the rest never gets a gradient worth the name. Real VLMs start from a pretrained vision
encoder (Qwen2.5-VL's ViT was trained on image-text pairs before the LM saw it); this is our
stand-in for that: every merged visual token also predicts, through small linear heads used only
in training, what the world drew under it.

Labels, per merged token (2 frames x 28 x 28 px): the object covering most of its pixels. Colour
has a 7th class, "nothing", for tokens with fewer than `MIN_PIXELS`; shape, size and motion are
only asked where the object covers at least `MIN_SHAPE_PIXELS`, since a sliver shows no shape.
"""

from __future__ import annotations

import numpy as np
import torch

from ..world import Scene
from ..world.render import object_map
from ..world.scene import COLOURS, MOTIONS, SHAPES, SIZES

TASKS = (("colour", len(COLOURS) + 1), ("shape", len(SHAPES)), ("size", len(SIZES)), ("motion", len(MOTIONS)))
MIN_PIXELS = 60  # of 2 x 784 in a token: less is "nothing here"
MIN_SHAPE_PIXELS = 120  # about a quarter of a small object in each of the two frames
IGNORE = -100
TOKEN_PX, TOKEN_FRAMES = 28, 2  # a merged Qwen2.5-VL token: 2x2 patches of 14 px, 2 frames


def token_labels(scene: Scene) -> np.ndarray:
    """[gt * lh * lw, 4] int64 (colour, shape, size, motion) per merged visual token, in the order
    the vision tower emits them (time, row, column); IGNORE where a task has no answer."""
    cfg = scene.cfg
    ids = object_map(scene)  # [T, H, W], -1 background
    gt, lh, lw = cfg.frames // TOKEN_FRAMES, cfg.height // TOKEN_PX, cfg.width // TOKEN_PX
    tokens = ids[: gt * TOKEN_FRAMES].reshape(gt, TOKEN_FRAMES, lh, TOKEN_PX, lw, TOKEN_PX)
    n = len(scene.objects)
    counts = np.stack([(tokens == k).sum(axis=(1, 3, 5)) for k in range(n)], -1) if n else \
        np.zeros((gt, lh, lw, 1), np.int64)  # [gt, lh, lw, objects]
    counts = counts.reshape(gt * lh * lw, -1)
    top, covered = counts.argmax(-1), counts.max(-1)
    per_object = np.array([[list(COLOURS).index(o.colour), SHAPES.index(o.shape), list(SIZES).index(o.size),
                            list(MOTIONS).index(o.motion)] for o in scene.objects] or [[0, 0, 0, 0]], np.int64)
    labels = per_object[top].copy()  # [tokens, 4]
    labels[covered < MIN_PIXELS, 0] = len(COLOURS)  # "nothing here"
    labels[covered < MIN_SHAPE_PIXELS, 1:] = IGNORE
    return labels


class VisionHeads(torch.nn.Module):
    """Training-only linear heads on the merged visual tokens (the LM's input width)."""

    def __init__(self, width: int):
        super().__init__()
        self.heads = torch.nn.ModuleList(torch.nn.Linear(width, k) for _, k in TASKS)

    def loss(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """tokens [N, width], labels [N, 4] -> mean over tasks of each task's cross-entropy."""
        losses = [torch.nn.functional.cross_entropy(h(tokens), labels[:, i], ignore_index=IGNORE)
                  for i, h in enumerate(self.heads) if (labels[:, i] != IGNORE).any()]
        return torch.stack(losses).mean()

    @torch.no_grad()
    def accuracy(self, tokens: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
        out = {}
        for i, (name, _) in enumerate(TASKS):
            keep = labels[:, i] != IGNORE
            pred = self.heads[i](tokens[keep]).argmax(-1)
            out[name] = round(float((pred == labels[keep, i]).float().mean()), 4) if keep.any() else float("nan")
        return out


class VisualTokenTap:
    """Keeps the vision tower's merged output of the last forward (the tokens the LM reads)."""

    def __init__(self, model):
        self.tokens = None  # [visual tokens, width]
        self._handle = model.model.visual.register_forward_hook(self._keep)

    def _keep(self, module, args, output):
        self.tokens = output.pooler_output if hasattr(output, "pooler_output") else output

    def remove(self) -> None:
        self._handle.remove()

    def take(self) -> torch.Tensor:
        tokens, self.tokens = self.tokens, None
        if tokens is None:
            raise RuntimeError("the vision tower did not run in the last forward")
        return tokens
