"""The hard world's captions: the same scenes as `caption.py`, said the way people say things,
with real choice at many tokens, so a draft cannot copy a template (issue 29).

  "this clip shows nine shapes . there are two red shapes . a red circle , large , heading left
   . it shows up later . we see a little red cross that stays still . a big green square is
   going up . ... nothing else happens ."

What is fixed, so that a small captioner can learn it: objects come in the easy world's colour
order, and within one colour in the order they appear (an event order read off the video's
time axis). What varies, drawn per caption:
  - four sentence shapes per object, never the previous object's one (word order, and whether
    the size comes before or after the name);
  - synonyms for every size and motion word ("big"/"large", "going"/"heading"/"moving");
  - optional clauses: a count of the colour's shapes before a colour with two or more, and when
    an object arrives late or leaves early, a sentence saying so (events in time);
  - the opening (with the count of all shapes) and the closing line.
Choices are near-even on purpose: a target that learned them has near-tied next-token
probabilities there, and which one greedy decoding takes is a fine function of its state, as in
a real captioner. That is what makes drafts miss, and what the demo world lacked (7.8 of 9).

`facts` reads a caption back into what it claims, so accuracy is scored by meaning, not words.
"""

from __future__ import annotations

import zlib

import numpy as np

from .scene import COLOURS, SHAPES, ObjectTrack, Scene

PROMPT = "describe the video ."
NUMBERS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
           "twelve", "thirteen", "fourteen", "fifteen", "sixteen")
LATE, EARLY_EXIT = 0.15, 0.9  # appears after 15% of the clip / is gone before 90% of it

# meaning -> (words, weights). A meaning's words are interchangeable; the weights are how often
# each is said in the training captions.
SIZE_WORDS = {"big": (("big", "large"), (0.5, 0.5)), "small": (("small", "little"), (0.55, 0.45))}
MOVING = (("moving", "going", "heading"), (0.4, 0.3, 0.3))  # + direction
STAYING = (("staying", "standing", "keeping"), (0.4, 0.35, 0.25))  # + "still"
MOVES = (("moves", "goes", "heads"), (0.4, 0.3, 0.3))
STAYS = (("stays", "stands", "keeps"), (0.4, 0.35, 0.25))
ARRIVES = (("appears later", "shows up later"), (0.5, 0.5))
LEAVES = (("leaves before the end", "disappears before the end"), (0.55, 0.45))
OPENINGS = (("this clip shows {n} shapes", "the video shows {n} shapes", "we see {n} shapes"), (0.4, 0.3, 0.3))
CLOSINGS = (("that is all", "nothing else happens", "that is everything"), (0.4, 0.3, 0.3))
TEMPLATES = (  # {size} {colour} {shape} {going} {dir}; {goes}: the verb form
    "there is a {size} {colour} {shape} {going} {dir}",
    "a {colour} {shape} , {size} , {going} {dir}",
    "we see a {size} {colour} {shape} that {goes} {dir}",
    "a {size} {colour} {shape} is {going} {dir}",
)
TEMPLATE_WEIGHTS = (0.3, 0.25, 0.25, 0.2)
COUNT_SHARE = 0.5  # a colour with 2+ shapes is counted first in half the captions
TIME_SHARE = 0.7  # a late or early-leaving object gets its time sentence in 70% of them


def caption(scene: Scene, seed: int | None = None) -> str:
    """One of the many right captions of `scene`: the phrasing is drawn with `seed` (default:
    from the scene's content, so a scene always gets the same one)."""
    rng = np.random.default_rng(_scene_seed(scene) if seed is None else seed)
    said = [_pick(rng, OPENINGS).format(n=NUMBERS[len(scene.objects)])]
    previous = -1
    for colour in COLOURS:
        group = sorted((o for o in scene.objects if o.colour == colour),
                       key=lambda o: (o.appear, SHAPES.index(o.shape)))
        if len(group) >= 2 and rng.random() < COUNT_SHARE:
            said.append(f"there are {NUMBERS[len(group)]} {colour} shapes")
        for obj in group:
            previous = _template(rng, previous)
            said.append(_object_sentence(rng, obj, TEMPLATES[previous]))
            when = _time_sentence(rng, obj)
            if when:
                said.append(when)
    said.append(_pick(rng, CLOSINGS))
    return " ".join(s + " ." for s in said)


def _object_sentence(rng, obj: ObjectTrack, template: str) -> str:
    moving = obj.motion != "staying still"
    direction = obj.motion.split()[1]  # left, right, up, down, or still
    return template.format(size=_pick(rng, SIZE_WORDS[obj.size]), colour=obj.colour, shape=obj.shape,
                           going=_pick(rng, MOVING if moving else STAYING),
                           goes=_pick(rng, MOVES if moving else STAYS), dir=direction)


def _time_sentence(rng, obj: ObjectTrack) -> str | None:
    late, leaves = obj.appear > LATE, obj.vanish < EARLY_EXIT
    if not (late or leaves) or rng.random() >= TIME_SHARE:
        return None
    parts = ([_pick(rng, ARRIVES)] if late else []) + ([_pick(rng, LEAVES)] if leaves else [])
    return "it " + " and ".join(parts)


def _template(rng, previous: int) -> int:
    """A sentence shape other than the previous object's (people vary their sentences)."""
    w = np.array(TEMPLATE_WEIGHTS)
    if previous >= 0:
        w[previous] = 0.0
    return int(rng.choice(len(w), p=w / w.sum()))


def _pick(rng, options: tuple[tuple[str, ...], tuple[float, ...]]) -> str:
    words, weights = options
    return words[int(rng.choice(len(words), p=np.asarray(weights) / sum(weights)))]


def _scene_seed(scene: Scene) -> int:
    return zlib.crc32(repr(scene.objects).encode())


# ---------------------------------------------------------------------------- reading it back

MEANING = {w: m for m, (ws, _) in SIZE_WORDS.items() for w in ws}
MEANING.update({w: "moving" for w in MOVING[0] + MOVES[0]})
MEANING.update({w: "staying" for w in STAYING[0] + STAYS[0]})


def facts(text: str) -> set[str]:
    """What a caption claims, as comparable strings: "count 9", "red circle", "red circle size
    big", "red circle motion left", "red circle late", "red circle leaves", "red count 2".
    Words it cannot place are ignored (a wrong caption loses facts, it does not crash)."""
    out, current = set(), None
    for sentence in text.split(" . "):
        words = sentence.removesuffix(" .").split()
        if words[:1] == ["it"] and current:
            out |= {f"{current} late"} if "later" in words else set()
            out |= {f"{current} leaves"} if "end" in words else set()
            continue
        if words[-1:] == ["shapes"]:  # "... nine shapes" or "there are two red shapes"
            colour = words[-2] if len(words) >= 3 and words[-2] in COLOURS else None
            number = words[-3] if colour else words[-2] if len(words) >= 2 else None
            if number in NUMBERS:
                out.add(f"{colour} count {NUMBERS.index(number)}" if colour else f"count {NUMBERS.index(number)}")
            continue
        names = [i for i in range(len(words) - 1) if words[i] in COLOURS and words[i + 1] in SHAPES]
        if len(names) != 1:
            current = None
            continue
        current = f"{words[names[0]]} {words[names[0] + 1]}"
        out.add(current)
        meanings = [MEANING.get(w) for w in words]
        out |= {f"{current} size {m}" for m in meanings if m in SIZE_WORDS}
        if "moving" in meanings:
            out |= {f"{current} motion {w}" for w in words if w in ("left", "right", "up", "down")}
        elif "staying" in meanings:
            out.add(f"{current} motion still")
    return out


def scene_facts(scene: Scene) -> set[str]:
    """Every fact a complete caption of `scene` can state (optional ones included)."""
    out = {f"count {len(scene.objects)}"}
    for colour in COLOURS:
        group = [o for o in scene.objects if o.colour == colour]
        if len(group) >= 2:
            out.add(f"{colour} count {len(group)}")
    for o in scene.objects:
        out |= {o.name, f"{o.name} size {o.size}", f"{o.name} motion {o.motion.split()[1]}"}
        out |= {f"{o.name} late"} if o.appear > LATE else set()
        out |= {f"{o.name} leaves"} if o.vanish < EARLY_EXIT else set()
    return out


def tokenizer_corpus(scenes: int = 400) -> str:
    """Captions of training scenes (seeds 0..scenes-1) for the hard target's BPE: trained on them
    too, every caption word but a few rare numbers is one token (1.0 tokens per word against 2.3
    with the shared tokenizer, whose pieces made most caption tokens a free guess for a draft)."""
    from .scene import sample_scene

    return "\n" + "\n".join(caption(sample_scene(seed)) for seed in range(scenes))


def vocabulary() -> list[str]:
    """Every word a caption or the prompt can contain."""
    text = " ".join([PROMPT, "there is are a an , . it and that shapes", *NUMBERS, *COLOURS, *SHAPES,
                     *TEMPLATES, *(w for ws, _ in SIZE_WORDS.values() for w in ws),
                     *(w for group in (MOVING, STAYING, MOVES, STAYS, ARRIVES, LEAVES, OPENINGS, CLOSINGS)
                       for w in group[0]), "left right up down still"])
    words = [w for w in text.split() if "{" not in w]
    return list(dict.fromkeys(words))
