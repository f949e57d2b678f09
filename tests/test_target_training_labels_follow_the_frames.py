"""What the demo target is trained and scored on: the dense vision labels name the object the world
drew under each merged visual token, and the caption's decision tokens (where a colour, shape,
size or motion is chosen) are each scored once."""

import os
from collections import Counter

import numpy as np
import pytest
from conftest import DEMO_MODELS

from sparrow_world.demo.target_data import CONT, token_categories, word_hits
from sparrow_world.demo.vision_aux import IGNORE, TASKS, VisionHeads, token_labels
from sparrow_world.world import WorldConfig, caption, render, sample_scene
from sparrow_world.world.render import BACKGROUND, object_map
from sparrow_world.world.scene import COLOURS, MOTIONS, SHAPES, SIZES, ObjectTrack, Scene


@pytest.mark.parametrize("seed", range(3))
def test_object_map_marks_exactly_the_drawn_pixels(seed):
    scene = sample_scene(seed, WorldConfig(duration_s=8))
    frames, ids = render(scene), object_map(scene)  # [T, H, W, 3], [T, H, W]
    background = ids < 0
    assert (frames[background] == BACKGROUND).all()
    palette = np.array([COLOURS[o.colour] for o in scene.objects], np.uint8)  # [objects, 3]
    assert (frames[~background] == palette[ids[~background]]).all()


def test_token_labels_name_the_object_under_each_token():
    cfg = WorldConfig(duration_s=4)
    # a big blue square centred on the merged token at row 1, column 1 (pixels 28-56), moving right
    square = ObjectTrack(shape="square", colour="blue", size="big", motion="moving right",
                         start=(42 / 112, 42 / 112), appear=0.0, vanish=1.0)
    labels = token_labels(Scene(cfg, (square,)))  # [gt * 4 * 4, 4]
    assert labels.shape == (cfg.frames // 2 * 16, len(TASKS))
    first = labels[:16].reshape(4, 4, len(TASKS))  # the first temporal patch, [row, column, task]
    expected = [list(COLOURS).index("blue"), SHAPES.index("square"), list(SIZES).index("big"),
                list(MOTIONS).index("moving right")]
    assert first[1, 1].tolist() == expected
    assert first[3, 3].tolist() == [len(COLOURS), IGNORE, IGNORE, IGNORE]  # nothing drawn there


def test_vision_heads_learn_labels_from_tokens():
    import torch

    torch.manual_seed(0)
    labels = torch.from_numpy(token_labels(sample_scene(3, WorldConfig(duration_s=16))))  # [tokens, 4]
    tokens = torch.nn.functional.one_hot(labels.clamp(min=0), 8).flatten(1).float()  # labels, encoded
    heads = VisionHeads(tokens.shape[1])
    opt = torch.optim.Adam(heads.parameters(), 0.1)
    for _ in range(100):
        loss = heads.loss(tokens, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert all(v == 1.0 for v in heads.accuracy(tokens, labels).values())


@pytest.mark.parametrize("seed", range(4))
def test_each_caption_decision_is_scored_once(seed):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(os.path.join(DEMO_MODELS, "target"))
    scene = sample_scene(seed)
    text = caption(scene)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    cats = token_categories(text, enc["offset_mapping"])
    assert cats[0] != CONT and len(cats) == len(enc["input_ids"])
    words = word_hits([True] * len(cats), cats)
    assert len(words) == len(text.split())  # one score per word, however many tokens it has
    n, moving = len(scene.objects), sum(o.motion != "staying still" for o in scene.objects)
    counts = Counter(cat for cat, _ in words)
    assert counts["colour"] == counts["shape"] == counts["size"] == n
    assert counts["motion"] == n + moving  # "moving" + its direction, or "staying" ("still" follows)
    # circle and cross share their first token " c": a shape is right only when all its tokens are
    first = next(i for i, c in enumerate(cats) if c == "shape" and cats[i + 1] == CONT)
    scored = word_hits([i != first + 1 for i in range(len(cats))], cats)
    assert [ok for _, ok in scored].count(False) == 1
    assert next(ok for cat, ok in scored if cat == "shape") is (cats.index("shape") != first)
