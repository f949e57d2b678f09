"""Evaluation clips: one world scene per clip, rendered at the length that gives the wanted
number of visual tokens, with the caption it should get."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..world import WorldConfig, caption, sample_scene, write_scene


@dataclass(frozen=True)
class Clip:
    path: Path
    visual_tokens: int
    seconds: int
    truth: str  # the caption the scene determines


def eval_clips(folder: str | Path, lengths: tuple[int, ...], per_length: int, seed0: int) -> dict[int, list[Clip]]:
    """Clips per requested visual length (written once, reused on reruns). The same scenes
    appear at every length, stretched: only the length changes along a row of the table."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    clips: dict[int, list[Clip]] = {}
    for tokens in lengths:
        cfg = WorldConfig.for_visual_tokens(tokens)
        row = []
        for i in range(per_length):
            scene = sample_scene(seed0 + i, cfg)
            path = folder / f"s{seed0 + i}_{cfg.duration_s}s.mp4"
            if not path.exists():
                tmp = path.with_suffix(".tmp.mp4")
                write_scene(scene, tmp)
                tmp.replace(path)
            row.append(Clip(path, cfg.visual_tokens_qwen25vl(), cfg.duration_s, caption(scene)))
        clips[tokens] = row
    return clips
