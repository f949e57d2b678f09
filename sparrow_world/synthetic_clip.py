"""The synthetic test clip: coloured squares bouncing over a plain background, the same pixels
for the same arguments. What the tests and the demo kit encode when they need a video; the product
only reads videos (vllm_sparrow/video.py, whose write_frames encodes these frames)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from vllm_sparrow.video import write_frames


def write_synthetic_clip(
    path: str | Path,
    num_frames: int,
    width: int = 112,
    height: int = 112,
    fps: float = 4.0,
    seed: int = 0,
) -> Path:
    """Encode ``num_frames`` of coloured squares moving over a plain background (H.264 mp4).

    The same arguments give the same pixels (the squares' colours, sizes, starts and
    velocities come from ``seed``); the encoded bytes may differ across libx264 builds.
    """
    if num_frames < 1:
        raise ValueError(f"num_frames must be >= 1, got {num_frames}")
    return write_frames(path, synthetic_frames(num_frames, width, height, seed), fps)


def synthetic_frames(num_frames: int, width: int, height: int, seed: int) -> np.ndarray:
    """(T, H, W, 3) uint8: 3 squares that bounce off the borders, over a seeded background."""
    rng = np.random.default_rng(seed)
    background = rng.integers(0, 96, size=3, dtype=np.uint8)  # dark, so squares stand out
    n_squares = 3
    short = min(width, height)
    sides = rng.integers(max(4, short // 8), max(5, short // 3), n_squares)  # (S,)
    colours = rng.integers(128, 256, size=(n_squares, 3), dtype=np.uint8)  # (S, 3) bright RGB
    room = np.array([width, height]) - sides[:, None]  # (S, 2): free travel along x, y
    starts = rng.uniform(0, 1, size=(n_squares, 2)) * room  # (S, 2) x, y in pixels
    speeds = rng.uniform(2, 8, size=(n_squares, 2)) * rng.choice([-1, 1], size=(n_squares, 2))

    frames = np.empty((num_frames, height, width, 3), dtype=np.uint8)
    for t in range(num_frames):
        frames[t] = background
        for s in range(n_squares):
            x, y = (bounce(starts[s, i] + speeds[s, i] * t, room[s, i]) for i in range(2))
            frames[t, y : y + sides[s], x : x + sides[s]] = colours[s]
    return frames


def bounce(position: float, room: int) -> int:
    """Fold a straight-line position into [0, room] as if it bounced off both walls."""
    if room <= 0:
        return 0
    folded = position % (2 * room)
    return int(room - abs(folded - room) if folded > room else folded)
