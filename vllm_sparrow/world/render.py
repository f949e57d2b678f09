"""Draw a scene frame by frame (numpy) and encode it with PyAV."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..video import write_frames
from .scene import COLOURS, ObjectTrack, Scene, WorldConfig

BACKGROUND = (24, 24, 32)


def render(scene: Scene) -> np.ndarray:
    """(T, H, W, 3) uint8; later objects are drawn over earlier ones."""
    cfg = scene.cfg
    total = cfg.duration_s * cfg.fps
    ys, xs = np.mgrid[0 : cfg.height, 0 : cfg.width] + 0.5  # pixel centres [H, W]
    frames = np.empty((total, cfg.height, cfg.width, 3), dtype=np.uint8)
    for i in range(total):
        frame = frames[i]
        frame[:] = BACKGROUND
        for obj in scene.objects:
            centre = obj.centre_at(i / cfg.fps, cfg)
            if centre is not None:
                frame[_mask(obj, centre, xs, ys, cfg)] = COLOURS[obj.colour]
    return frames


def _mask(obj: ObjectTrack, centre, xs, ys, cfg: WorldConfig) -> np.ndarray:
    """[H, W] bool: the pixels the object covers."""
    dx, dy = xs - centre[0], ys - centre[1]
    r = obj.side(cfg) / 2
    if obj.shape == "square":
        return (np.abs(dx) <= r) & (np.abs(dy) <= r)
    if obj.shape == "circle":
        return dx * dx + dy * dy <= r * r
    if obj.shape == "triangle":  # apex up: width grows linearly towards the base
        return (dy >= -r) & (dy <= r) & (np.abs(dx) <= (dy + r) / 2)
    bar = r / 3  # cross
    return ((np.abs(dx) <= r) & (np.abs(dy) <= bar)) | ((np.abs(dy) <= r) & (np.abs(dx) <= bar))


def write_scene(scene: Scene, path: str | Path) -> Path:
    return write_frames(path, render(scene), scene.cfg.fps)
