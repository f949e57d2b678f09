"""A synthetic video world whose captions are fully determined by what is on screen.

A scene is a set of objects (shape, colour, size) that each appear at a whole second in one of
nine regions, move in one direction (or stay) at a fixed speed, stop at the border, and may
vanish at a later whole second. `render.py` draws it, `caption.py` describes it. The same
seed and config give the same scene, frames and caption.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

SHAPES = ("square", "circle", "triangle", "cross")
COLOURS = {"red": (230, 40, 40), "green": (40, 200, 60), "blue": (50, 90, 240),
           "yellow": (240, 220, 40), "white": (235, 235, 235), "purple": (170, 60, 210)}
SIZES = {"small": 0.14, "big": 0.24}  # side as a share of the shorter frame side
MOTIONS = ("stays still", "moves left", "moves right", "moves up", "moves down")
REGIONS = ("top left", "top", "top right", "left", "center", "right", "bottom left", "bottom",
           "bottom right")
_DIRECTION = {"stays still": (0, 0), "moves left": (-1, 0), "moves right": (1, 0),
              "moves up": (0, -1), "moves down": (0, 1)}


@dataclass(frozen=True)
class WorldConfig:
    width: int = 112  # multiples of 28 keep Qwen2.5-VL's patches whole
    height: int = 112
    fps: int = 2  # Qwen2.5-VL merges 2 frames per temporal patch: 1 patch per second at 2 fps
    duration_s: int = 16
    min_objects: int = 6
    max_objects: int = 9
    speed: float = 0.08  # share of the frame side travelled per second

    def visual_tokens_qwen25vl(self) -> int:
        """Visual tokens this clip becomes through Qwen2.5-VL's processor (14 px patches,
        2x2 spatial and 2-frame temporal merge)."""
        frames = self.duration_s * self.fps
        return (frames // 2) * (self.height // 28) * (self.width // 28)


@dataclass(frozen=True)
class ObjectTrack:
    shape: str
    colour: str
    size: str
    region: str  # where it appears
    motion: str
    appear_s: int
    vanish_s: int | None  # None: still there at the end

    @property
    def name(self) -> str:
        return f"{self.colour} {self.shape}"

    def centre_at(self, t: float, cfg: WorldConfig) -> tuple[float, float] | None:
        """Centre (x, y) in pixels at time t (seconds), or None when not on screen."""
        if t < self.appear_s or (self.vanish_s is not None and t >= self.vanish_s):
            return None
        col, row = REGIONS.index(self.region) % 3, REGIONS.index(self.region) // 3
        half = self.side(cfg) / 2
        x0 = half + (col + 0.5) / 3 * (cfg.width - 2 * half)
        y0 = half + (row + 0.5) / 3 * (cfg.height - 2 * half)
        dx, dy = _DIRECTION[self.motion]
        travel = cfg.speed * (t - self.appear_s)
        x = float(np.clip(x0 + dx * travel * cfg.width, half, cfg.width - half))
        y = float(np.clip(y0 + dy * travel * cfg.height, half, cfg.height - half))
        return x, y

    def side(self, cfg: WorldConfig) -> float:
        return SIZES[self.size] * min(cfg.width, cfg.height)


@dataclass(frozen=True)
class Scene:
    cfg: WorldConfig
    objects: tuple[ObjectTrack, ...] = field(default_factory=tuple)


def sample_scene(seed: int, cfg: WorldConfig = WorldConfig()) -> Scene:
    """A random scene: distinct (colour, shape) pairs, so "the red square" is unambiguous."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(cfg.min_objects, cfg.max_objects + 1))
    pairs = [(c, s) for c in COLOURS for s in SHAPES]
    chosen = rng.choice(len(pairs), size=n, replace=False)
    last = max(cfg.duration_s - 1, 0)
    objects: list[ObjectTrack] = []
    for k in chosen:
        colour, shape = pairs[int(k)]
        appear = int(rng.integers(0, max(1, cfg.duration_s // 2)))
        vanish = None
        if rng.random() < 0.5 and appear + 1 <= last:
            vanish = int(rng.integers(appear + 1, last + 1))
        region = _free_region(objects, appear, vanish, rng)
        objects.append(ObjectTrack(
            shape=shape, colour=colour, size=str(rng.choice(list(SIZES))), region=region,
            motion=str(rng.choice(_motions_from(region))), appear_s=appear, vanish_s=vanish))
    objects.sort(key=lambda o: (o.appear_s, o.name))  # caption and draw order
    return Scene(cfg, tuple(objects))


def _free_region(placed: list[ObjectTrack], appear: int, vanish: int | None, rng) -> str:
    """A region no object alive at the same time started in (so objects rarely overlap)."""
    end = vanish if vanish is not None else 1 << 30
    busy = {o.region for o in placed
            if o.appear_s < end and (o.vanish_s is None or o.vanish_s > appear)}
    free = [r for r in REGIONS if r not in busy] or list(REGIONS)
    return str(rng.choice(free))


def _motions_from(region: str) -> list[str]:
    """Motions that have room to show: none runs straight into the border it starts at."""
    col, row = REGIONS.index(region) % 3, REGIONS.index(region) // 3
    blocked = {("moves left" if col == 0 else None), ("moves right" if col == 2 else None),
               ("moves up" if row == 0 else None), ("moves down" if row == 2 else None)}
    return [m for m in MOTIONS if m not in blocked]
