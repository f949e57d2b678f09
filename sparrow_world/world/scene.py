"""A synthetic video world whose captions are fully determined by what is on screen.

A scene is a set of objects, each a distinct (colour, shape) pair with a size, that appears at
some moment, moves in one direction at a constant speed (or stays), wraps around the frame
borders, and vanishes at a later moment (or stays to the end). `render.py` draws it and
`caption.py` describes it. The same seed and config give the same scene, frames and caption.

Why times are fractions of the clip and motion wraps around: a 26-minute clip of a scene is the
same scene stretched in time, so every second of it looks like a second of the 32 s clip (same
speed on screen, same share of time on screen per object). The demo target is trained mostly on
short clips and must caption long ones; this keeps long clips in the distribution it learned.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

SHAPES = ("circle", "square", "triangle", "cross")
COLOURS = {"red": (230, 40, 40), "green": (40, 200, 60), "blue": (50, 90, 240),
           "yellow": (240, 220, 40), "white": (235, 235, 235), "purple": (170, 60, 210)}
SIZES = {"small": 0.16, "big": 0.26}  # side as a share of the shorter frame side
MOTIONS = {"staying still": (0, 0), "moving left": (-1, 0), "moving right": (1, 0),
           "moving up": (0, -1), "moving down": (0, 1)}


@dataclass(frozen=True)
class WorldConfig:
    width: int = 112  # multiples of 28 keep Qwen2.5-VL's patches whole
    height: int = 112
    fps: int = 2  # Qwen2.5-VL merges 2 frames per temporal patch: one patch per second at 2 fps
    duration_s: int = 16
    min_objects: int = 7
    max_objects: int = 12
    speed: float = 0.1  # share of the frame side travelled per second
    min_life: float = 0.4  # shortest time on screen, as a share of the clip

    def __post_init__(self):
        if self.width % 28 or self.height % 28:
            raise ValueError(f"frame sides must be multiples of 28 px, got {self.width}x{self.height}")
        if self.duration_s < 2 or self.fps < 1:
            raise ValueError(f"need duration_s >= 2 and fps >= 1, got {self.duration_s}, {self.fps}")
        if not 1 <= self.min_objects <= self.max_objects <= len(SHAPES) * len(COLOURS):
            raise ValueError(f"need 1 <= min_objects <= max_objects <= {len(SHAPES) * len(COLOURS)}")

    @property
    def frames(self) -> int:
        return self.duration_s * self.fps

    def visual_tokens_qwen25vl(self) -> int:
        """Visual tokens this clip becomes through Qwen2.5-VL's processor (14 px patches,
        2x2 spatial and 2-frame temporal merge)."""
        return (self.frames // 2) * (self.height // 28) * (self.width // 28)

    @classmethod
    def for_visual_tokens(cls, tokens: int, **kw) -> "WorldConfig":
        """The clip length whose Qwen2.5-VL visual token count is closest to `tokens`."""
        probe = cls(**kw)
        per_second = probe.visual_tokens_qwen25vl() / probe.duration_s
        return cls(**{**kw, "duration_s": max(2, round(tokens / per_second))})


@dataclass(frozen=True)
class ObjectTrack:
    shape: str
    colour: str
    size: str
    motion: str
    start: tuple[float, float]  # centre where it appears, as shares of (width, height)
    appear: float  # share of the clip at which it appears
    vanish: float  # share of the clip at which it is gone (1.0: stays to the end)

    @property
    def name(self) -> str:
        return f"{self.colour} {self.shape}"

    def alive_at(self, t: float, cfg: WorldConfig) -> bool:
        return self.appear * cfg.duration_s <= t < self.vanish * cfg.duration_s

    def centre_at(self, t: float, cfg: WorldConfig) -> tuple[float, float] | None:
        """Centre (x, y) in pixels at time t (seconds), wrapped into the frame, or None when
        the object is not on screen."""
        if not self.alive_at(t, cfg):
            return None
        dx, dy = MOTIONS[self.motion]
        travel = cfg.speed * (t - self.appear * cfg.duration_s)
        x = (self.start[0] + dx * travel) % 1.0
        y = (self.start[1] + dy * travel) % 1.0
        return x * cfg.width, y * cfg.height

    def side(self, cfg: WorldConfig) -> float:
        return SIZES[self.size] * min(cfg.width, cfg.height)


@dataclass(frozen=True)
class Scene:
    cfg: WorldConfig
    objects: tuple[ObjectTrack, ...] = field(default_factory=tuple)

    def with_duration(self, duration_s: int) -> "Scene":
        """The same scene stretched or squeezed to another clip length."""
        from dataclasses import replace

        return Scene(replace(self.cfg, duration_s=duration_s), self.objects)


def sample_scene(seed: int, cfg: WorldConfig = WorldConfig()) -> Scene:
    """A random scene: distinct (colour, shape) pairs, so the caption names each object once."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(cfg.min_objects, cfg.max_objects + 1))
    pairs = [(c, s) for c in COLOURS for s in SHAPES]
    chosen = sorted(rng.choice(len(pairs), size=n, replace=False).tolist())
    objects = []
    for k in chosen:  # caption order: colour, then shape
        colour, shape = pairs[k]
        life = rng.uniform(cfg.min_life, 1.0)
        appear = float(rng.uniform(0.0, 1.0 - life))
        objects.append(ObjectTrack(
            shape=shape, colour=colour, size=str(rng.choice(list(SIZES))),
            motion=str(rng.choice(list(MOTIONS))),
            start=(float(rng.uniform(0.15, 0.85)), float(rng.uniform(0.15, 0.85))),
            appear=appear, vanish=min(1.0, appear + life)))
    return Scene(cfg, tuple(objects))
