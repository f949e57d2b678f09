"""The synthetic video world: captions are determined by content (every sentence is visible in
the frames), deterministic, 100-300 words, from a small vocabulary; clips survive PyAV encoding;
clip sizes reach from ~0.5k to ~25k Qwen2.5-VL visual tokens."""

import dataclasses

import numpy as np
import pytest

from vllm_sparrow.world import WorldConfig, caption, render, sample_scene, vocabulary, write_scene
from vllm_sparrow.world.scene import COLOURS, Scene

CFG = WorldConfig()


def _alone(scene, obj):
    return Scene(scene.cfg, (obj,))


def _pixel(frame, xy):
    return tuple(int(v) for v in frame[int(xy[1]), int(xy[0])])


@pytest.mark.parametrize("seed", range(6))
def test_each_sentence_is_visible_in_the_frames(seed):
    scene = sample_scene(seed, CFG)
    for obj in scene.objects:
        frames = render(_alone(scene, obj))
        at = obj.appear_s * CFG.fps
        centre = obj.centre_at(obj.appear_s, CFG)
        assert _pixel(frames[at], centre) == COLOURS[obj.colour], obj  # appears, where said
        if at > 0:
            assert not (frames[at - 1] == COLOURS[obj.colour]).all(-1).any()  # not before
        end = CFG.duration_s if obj.vanish_s is None else obj.vanish_s
        later = obj.centre_at(end - 0.5, CFG)
        moved = np.subtract(later, centre)
        if obj.motion == "stays still":
            assert np.abs(moved).max() == 0
        else:
            axis, sign = {"left": (0, -1), "right": (0, 1), "up": (1, -1), "down": (1, 1)}[obj.motion.split()[1]]
            assert sign * moved[axis] > 0 and moved[1 - axis] == 0, obj
        if obj.vanish_s is not None:  # gone from its vanish second on
            assert not (frames[obj.vanish_s * CFG.fps] == COLOURS[obj.colour]).all(-1).any()


def test_captions_are_deterministic_distinct_and_sized():
    caps = [caption(sample_scene(s, CFG)) for s in range(40)]
    assert caps[:5] == [caption(sample_scene(s, CFG)) for s in range(5)]
    assert len(set(caps)) == len(caps)
    lengths = [len(c.split()) for c in caps]
    assert 100 <= min(lengths) and max(lengths) <= 300, (min(lengths), max(lengths))
    words = set(vocabulary())
    assert all(w in words for c in caps for w in c.split())
    assert np.array_equal(render(sample_scene(3, CFG)), render(sample_scene(3, CFG)))


def test_clip_round_trips_through_pyav(tmp_path):
    from vllm_sparrow.video import decode_video

    scene = sample_scene(0, CFG)
    path = write_scene(scene, tmp_path / "scene.mp4")
    frames, meta = decode_video(path)
    drawn = render(scene)
    assert frames.shape == drawn.shape and meta["fps"] == CFG.fps
    assert np.abs(frames.astype(int) - drawn.astype(int)).mean() < 4  # near-lossless


def test_clip_sizes_span_half_k_to_25k_visual_tokens(target_dirs, tmp_path):
    from transformers import AutoProcessor

    from vllm_sparrow.testing.tiny_targets import make_prompt
    from vllm_sparrow.video import decode_video

    short = dataclasses.replace(CFG, duration_s=32)
    long = dataclasses.replace(CFG, duration_s=1560)
    assert 480 <= short.visual_tokens_qwen25vl() <= 560
    assert 24_000 <= long.visual_tokens_qwen25vl() <= 26_000
    # the formula is the processor's count (checked on a small clip)
    small = dataclasses.replace(CFG, duration_s=6)
    frames, meta = decode_video(write_scene(sample_scene(1, small), tmp_path / "s.mp4"))
    proc = AutoProcessor.from_pretrained(target_dirs("qwen2_5_vl"))
    meta = {k: v for k, v in meta.items() if k != "do_sample_frames"}
    ids = proc(text=[make_prompt("qwen2_5_vl", proc, "describe", "video")], videos=[frames],
               video_metadata=[meta], do_sample_frames=False, return_tensors="pt")["input_ids"][0]
    assert int((ids == proc.tokenizer.convert_tokens_to_ids("<|video_pad|>")).sum()) == small.visual_tokens_qwen25vl()
