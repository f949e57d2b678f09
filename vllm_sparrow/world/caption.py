"""The caption of a scene: events in time order, every word taken from `VOCABULARY`.

  "at second 0 a big red square appears at the top left . it moves right .
   at second 3 a small blue circle appears at the center . it stays still .
   at second 5 the red square vanishes . the video ends at second 16 ."

Everything it says is visible in the frames (what appears where, how it moves, when it goes),
and two scenes with different content get different captions.
"""

from __future__ import annotations

from .scene import COLOURS, MOTIONS, REGIONS, SHAPES, SIZES, Scene



def number(n: int) -> str:
    """Numbers are spelled digit by digit ("1 5 6"): ten words cover every time."""
    return " ".join(str(n))


def caption(scene: Scene) -> str:
    events: list[tuple[int, int, str]] = []  # (second, order: vanish before appear, text)
    for obj in scene.objects:
        events.append((obj.appear_s, 1, f"at second {number(obj.appear_s)} a {obj.size} {obj.name} "
                                         f"appears at the {obj.region} . it {obj.motion} ."))
        if obj.vanish_s is not None:
            events.append((obj.vanish_s, 0, f"at second {number(obj.vanish_s)} the {obj.name} vanishes ."))
    events.sort(key=lambda e: (e[0], e[1]))  # stable: same-second appearances keep scene order
    return " ".join(t for _, _, t in events) + f" the video ends at second {number(scene.cfg.duration_s)} ."


def vocabulary() -> list[str]:
    """Every word a caption (or the demo prompt) can contain."""
    words = ["at", "second", "a", "appears", "the", ".", "it", "vanishes", "video", "ends",
             "describe", "what", "happens", "in", "this"]
    words += list(SIZES) + list(COLOURS) + list(SHAPES)
    for phrase in MOTIONS + REGIONS:
        words += phrase.split()
    words += [str(i) for i in range(10)]
    return list(dict.fromkeys(words))  # unique, in a fixed order
