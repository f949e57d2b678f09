"""Draw a scene frame by frame (numpy) and encode it with PyAV."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from vllm_sparrow.video import write_frames
from .scene import COLOURS, ObjectTrack, Scene

BACKGROUND = (24, 24, 32)


def render(scene: Scene, first: int = 0, count: int | None = None) -> np.ndarray:
    """Frames [count, H, W, 3] uint8 from frame `first` on (default: all of them); objects
    later in the scene are drawn over earlier ones."""
    cfg = scene.cfg
    count = cfg.frames - first if count is None else count
    frames = np.empty((count, cfg.height, cfg.width, 3), dtype=np.uint8)
    frames[:] = BACKGROUND
    _paint_all(scene, frames, first, lambda k, obj: COLOURS[obj.colour])
    return frames


def object_map(scene: Scene, first: int = 0, count: int | None = None) -> np.ndarray:
    """[count, H, W] int16: which object (index into scene.objects) each pixel of `render`'s
    frames shows, -1 for background. Drawn by the same painter, so it matches pixel for pixel."""
    cfg = scene.cfg
    count = cfg.frames - first if count is None else count
    ids = np.full((count, cfg.height, cfg.width), -1, dtype=np.int16)
    _paint_all(scene, ids, first, lambda k, obj: k)
    return ids


def _paint_all(scene: Scene, canvas: np.ndarray, first: int, value) -> None:
    cfg = scene.cfg
    for i in range(len(canvas)):
        t = (first + i) / cfg.fps
        for k, obj in enumerate(scene.objects):
            centre = obj.centre_at(t, cfg)
            if centre is not None:
                _draw(canvas[i], obj, centre, obj.side(cfg) / 2, value(k, obj))


def _draw(frame: np.ndarray, obj: ObjectTrack, centre, r: float, value) -> None:
    """Paint `value` over the object and, where it crosses a border, its wrapped-around copies."""
    H, W = frame.shape[:2]
    for ox in (-W, 0, W):
        for oy in (-H, 0, H):
            cx, cy = centre[0] + ox, centre[1] + oy
            x0, x1 = max(0, int(cx - r)), min(W, int(cx + r) + 2)
            y0, y1 = max(0, int(cy - r)), min(H, int(cy + r) + 2)
            if x0 >= x1 or y0 >= y1:
                continue
            ys, xs = np.mgrid[y0:y1, x0:x1] + 0.5  # pixel centres of the bounding box
            frame[y0:y1, x0:x1][_mask(obj.shape, xs - cx, ys - cy, r)] = value


def _mask(shape: str, dx: np.ndarray, dy: np.ndarray, r: float) -> np.ndarray:
    """Pixels covered by `shape` of half-side r, given offsets from its centre."""
    if shape == "square":
        return (np.abs(dx) <= r) & (np.abs(dy) <= r)
    if shape == "circle":
        return dx * dx + dy * dy <= r * r
    if shape == "triangle":  # apex up: width grows linearly towards the base
        return (dy >= -r) & (dy <= r) & (np.abs(dx) <= (dy + r) / 2)
    bar = r / 3  # cross
    return ((np.abs(dx) <= r) & (np.abs(dy) <= bar)) | ((np.abs(dy) <= r) & (np.abs(dx) <= bar))


def write_scene(scene: Scene, path: str | Path) -> Path:
    """Encode the clip with PyAV in chunks of frames (long clips never sit in memory whole)."""
    return write_frames(path, _chunks(scene), scene.cfg.fps)


def _chunks(scene: Scene, size: int = 256):
    for first in range(0, scene.cfg.frames, size):
        yield from render(scene, first, min(size, scene.cfg.frames - first))
