"""The caption of a scene: one sentence per object, objects ordered by colour then shape, every
word taken from `vocabulary()`.

  "there is a red circle , big , moving left . there is a red cross , small , staying still .
   there is a blue square , small , moving up . ... that is all ."

Everything it says is visible in the frames (which objects appear, their colour, shape, size
and motion), and two scenes with different content get different captions. Why this shape:
objects come in a fixed colour order, so a captioner looks each colour up in the video instead
of tracking the order of events; and each sentence names the colour right before the shape, so
the shape, size and motion are read from the visual tokens of the colour just written, a
one-step lookup that a small model learns far sooner than "which object am I describing now".
"""

from __future__ import annotations

from .scene import COLOURS, MOTIONS, SHAPES, SIZES, Scene

PROMPT = "describe the video ."


def caption(scene: Scene) -> str:
    order = sorted(scene.objects, key=lambda o: (list(COLOURS).index(o.colour), SHAPES.index(o.shape)))
    said = [f"there is a {o.colour} {o.shape} , {o.size} , {o.motion} ." for o in order]
    return " ".join(said + ["that is all ."])


def vocabulary() -> list[str]:
    """Every word a caption or the demo prompt can contain."""
    words = ["there", "is", "a", ",", ".", "that", "all"] + PROMPT.split()
    words += list(COLOURS) + list(SIZES) + list(SHAPES)
    for phrase in MOTIONS:
        words += phrase.split()
    return list(dict.fromkeys(words))  # unique, in a fixed order
