"""The caption of a scene: the objects grouped by colour, every word taken from `vocabulary()`.

  "red : a big circle moving left and a small cross staying still . green : nothing .
   blue : a small square moving up . yellow : nothing . ... that is all ."

Everything it says is visible in the frames (which objects appear, their colour, shape, size
and motion), and two scenes with different content get different captions. Colours come in a
fixed order and shapes in a fixed order within a colour: a captioner must look for each colour
in the video rather than track the order of events, which a small model learns far sooner.
"""

from __future__ import annotations

from .scene import COLOURS, MOTIONS, SHAPES, SIZES, Scene

PROMPT = "describe the video ."


def caption(scene: Scene) -> str:
    parts = []
    for colour in COLOURS:
        objs = sorted((o for o in scene.objects if o.colour == colour), key=lambda o: SHAPES.index(o.shape))
        said = " and ".join(f"a {o.size} {o.shape} {o.motion}" for o in objs) or "nothing"
        parts.append(f"{colour} : {said} .")
    return " ".join(parts) + " that is all ."


def vocabulary() -> list[str]:
    """Every word a caption or the demo prompt can contain."""
    words = [":", ".", "a", "and", "nothing", "that", "is", "all"] + PROMPT.split()
    words += list(COLOURS) + list(SIZES) + list(SHAPES)
    for phrase in MOTIONS:
        words += phrase.split()
    return list(dict.fromkeys(words))  # unique, in a fixed order
