"""Evaluation clips: one world scene per clip, rendered at the length that gives the wanted
number of visual tokens, with the caption it should get."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..world import WorldConfig, sample_scene, write_scene
from ..world.languages import language


@dataclass(frozen=True)
class Clip:
    path: Path
    visual_tokens: int
    seconds: int
    truth: str  # the caption the scene determines (in the hard world: its default phrasing)
    facts: frozenset[str] | None = None  # hard world: every fact a caption of the scene may state


def eval_clips(folder: str | Path, lengths: tuple[int, ...], per_length: int, seed0: int,
               world: str = "easy") -> dict[int, list[Clip]]:
    """Clips per requested visual length (written once, reused on reruns). The same scenes
    appear at every length, stretched: only the length changes along a row of the table."""
    folder, words = Path(folder), language(world)
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
            facts = frozenset(words.scene_facts(scene)) if words.scene_facts else None
            row.append(Clip(path, cfg.visual_tokens_qwen25vl(), cfg.duration_s, words.caption(scene), facts))
        clips[tokens] = row
    return clips
