"""The synthetic video world: captions are determined by content (every sentence is visible in
the frames), deterministic, 100-300 words, from a small vocabulary; clips survive PyAV encoding;
clip sizes reach from ~0.5k to ~25k Qwen2.5-VL visual tokens."""

import dataclasses

import numpy as np
import pytest

from sparrow_world.world import WorldConfig, caption, render, sample_scene, vocabulary, write_scene
from sparrow_world.world.scene import COLOURS, MOTIONS, Scene

CFG = WorldConfig()


def _alone(scene, obj):
    return Scene(scene.cfg, (obj,))


def _pixel(frame, xy):
    return tuple(int(v) for v in frame[int(xy[1]), int(xy[0])])


@pytest.mark.parametrize("seed", range(6))
def test_each_object_is_visible_as_captioned(seed):
    scene = sample_scene(seed, CFG)
    for obj in scene.objects:
        frames = render(_alone(scene, obj))
        colour = COLOURS[obj.colour]
        on = [i for i in range(CFG.frames) if (frames[i] == colour).all(-1).any()]
        assert on, obj  # it is on screen, in its colour
        assert on == list(range(on[0], on[-1] + 1))  # one stretch: appears once, vanishes once
        i = on[0] + 1 if on[0] + 1 <= on[-1] else on[0]
        centre, before = obj.centre_at(i / CFG.fps, CFG), obj.centre_at(on[0] / CFG.fps, CFG)
        assert _pixel(frames[i], centre) == colour
        step = np.subtract(centre, before)
        step = (step + 56) % 112 - 56  # wrap-around motion: the short way round
        direction = tuple(int(np.sign(round(v, 6))) for v in step)
        assert direction == MOTIONS[obj.motion], obj
        side = (frames[on[len(on) // 2]] == colour).all(-1).sum() ** 0.5
        assert side > {"small": 10, "big": 20}[obj.size] * (0.6 if obj.shape in ("triangle", "cross") else 1)


@pytest.mark.parametrize("seed", range(4))
def test_caption_names_exactly_the_objects_in_the_scene(seed):
    scene = sample_scene(seed, CFG)
    sentences = caption(scene).split(" . ")
    assert sentences[-1] == "that is all ."
    said = {tuple(s.removeprefix("there is a ").split(" , ")) for s in sentences[:-1]}
    assert said == {(o.name, o.size, o.motion) for o in scene.objects}
    colours = [s.split()[3] for s in sentences[:-1]]
    assert colours == sorted(colours, key=list(COLOURS).index)  # colour order


def test_long_clips_are_the_short_clip_slowed_down():
    scene = sample_scene(5, CFG)
    long = scene.with_duration(CFG.duration_s * 10)
    short_frames, long_frames = render(scene), render(long, 0, long.cfg.frames)
    # every moment of the short clip is on screen in the long clip at the same share of time,
    # with the objects moving at the same on-screen speed
    for i in range(0, CFG.frames, 5):
        shown = {o.name for o in scene.objects if o.alive_at(i / CFG.fps, CFG)}
        assert shown == {o.name for o in long.objects if o.alive_at(i * 10 / long.cfg.fps, long.cfg)}
    assert long_frames.shape[0] == 10 * short_frames.shape[0]


def test_captions_are_deterministic_distinct_and_sized(target_dirs):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target_dirs("qwen2_5_vl"))  # the demo target's tokenizer
    caps = [caption(sample_scene(s, CFG)) for s in range(40)]
    assert caps[:5] == [caption(sample_scene(s, CFG)) for s in range(5)]
    assert len(set(caps)) == len(caps)
    lengths = [len(c.split()) for c in caps]
    assert 60 <= min(lengths) and max(lengths) <= 160, (min(lengths), max(lengths))  # words
    tokens = [len(tok(c)["input_ids"]) for c in caps]
    assert 100 <= min(tokens) and max(tokens) <= 300, (min(tokens), max(tokens))
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

    from sparrow_world.tiny_targets import make_prompt
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


def test_a_scene_encodes_to_the_same_file_every_time(tmp_path):
    """Benchmark clips are written anew in every run: the same scene must give the same bytes,
    or the target's captions (and every method's numbers) move between runs. Writing a clip
    again in one process used to give different files."""
    from sparrow_world.world import WorldConfig, sample_scene, write_scene

    scene = sample_scene(30_000_001, WorldConfig(duration_s=8))
    # x264's macroblock tree made another file now and then (1 write in 3 to 1 in 20): 20 writes
    files = {write_scene(scene, tmp_path / "clip.mp4").read_bytes() for _ in range(20)}
    assert len(files) == 1
