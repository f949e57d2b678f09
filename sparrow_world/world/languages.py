"""The two ways the world's scenes are captioned, as one interface the demo kit trains and scores with.

  easy  `caption.py`: one template, 29 words, one right caption per scene. Fast to learn; the
        test suite's smoke world and the original demo models (models/world).
  hard  `hard_caption.py`: near-even choices at many tokens, counts and event times, 78 words;
        many right captions per scene. What real captioning is like for a draft (issue 29).

Each word has a category: which decision it makes (colour, shape, size, motion, count, time,
or struct for the phrasing). Teacher-forced accuracy is scored per category on the exact words
of one right caption, so in the hard world the words that have synonyms (sizes, motions, times)
score below what the model knows; colours, shapes and counts have none. Free-running captions
are scored by meaning: `facts` reads what a hard-world caption claims.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .caption import PROMPT as EASY_PROMPT, caption as easy_caption, vocabulary as easy_vocabulary
from . import hard_caption as hard
from .scene import COLOURS, MOTIONS, SHAPES, SIZES, Scene

MOTION_WORDS = {w for m in MOTIONS for w in m.split()} - {"still"}  # "still" follows from "staying"


@dataclass(frozen=True)
class Language:
    name: str
    prompt: str
    caption: Callable[..., str]  # (scene, seed=None) -> caption; seed draws the phrasing
    vocabulary: Callable[[], list[str]]
    categories: tuple[str, ...]  # scored per word, in report order
    category: Callable[[str], str]  # word -> its category
    facts: Callable[[str], set[str]] | None = None  # caption -> what it claims (hard only)
    scene_facts: Callable[[Scene], set[str]] | None = None
    tokenizer_corpus: Callable[[], str] | None = None  # extra BPE training text (hard only)


def _easy_category(word: str) -> str:
    for cat, words in (("colour", COLOURS), ("size", SIZES), ("shape", SHAPES), ("motion", MOTION_WORDS)):
        if word in words:
            return cat
    return "struct"


def _hard_category(word: str) -> str:
    if hard.MEANING.get(word) in SIZES:
        return "size"
    if word in hard.MEANING or word in ("left", "right", "up", "down"):
        return "motion"
    if word in hard.NUMBERS:
        return "count"
    if word in ("appears", "shows", "leaves", "disappears"):  # arrives late / leaves early
        return "time"
    return _easy_category(word)


def _easy_caption(scene: Scene, seed: int | None = None) -> str:
    return easy_caption(scene)  # one right caption: nothing to draw


LANGUAGES = {
    "easy": Language("easy", EASY_PROMPT, _easy_caption, easy_vocabulary,
                     ("colour", "shape", "size", "motion", "struct", "end"), _easy_category),
    "hard": Language("hard", hard.PROMPT, hard.caption, hard.vocabulary,
                     ("colour", "shape", "size", "motion", "count", "time", "struct", "end"), _hard_category,
                     hard.facts, hard.scene_facts, hard.tokenizer_corpus),
}


def language(name: str) -> Language:
    if name not in LANGUAGES:
        raise ValueError(f"unknown world {name!r}: choose one of {', '.join(LANGUAGES)}")
    return LANGUAGES[name]
