"""`probe_layers` measures text->visual attention per decoder layer and suggests the IVSB layer.

A tiny 4-layer Qwen2.5-VL target (eager attention) probed on two synthetic video clips.
"""

import pytest
import torch

from sparrow_world.tiny_targets import build_tiny_target, make_prompt
from vllm_sparrow.training.probe_layers import format_probe, probe_layers, suggest_layer

KIND = "qwen2_5_vl"
NUM_LAYERS = 4


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor

    from vllm_sparrow.targets import target_spec

    d = build_tiny_target(KIND, tmp_path_factory.mktemp("probe") / "target", num_layers=NUM_LAYERS)
    model = AutoModelForImageTextToText.from_pretrained(
        d, dtype=torch.float32, attn_implementation="eager").eval()
    visual_ids = target_spec(AutoConfig.from_pretrained(d)).visual_token_ids
    return d, model, AutoProcessor.from_pretrained(d), visual_ids


@pytest.fixture(scope="module")
def video_inputs(target, tmp_path_factory):
    from vllm_sparrow.video import decode_video
    from sparrow_world.synthetic_clip import write_synthetic_clip

    _, _, proc, _ = target
    out = []
    for seed, text in [(1, "describe the video"), (2, "what moves first?")]:
        clip = write_synthetic_clip(tmp_path_factory.mktemp("clips") / f"c{seed}.mp4", 4, seed=seed)
        frames, meta = decode_video(clip, num_frames=4)
        meta = {k: v for k, v in meta.items() if k != "do_sample_frames"}  # VideoMetadata rejects it
        prompt = make_prompt(KIND, proc, text, "video")
        out.append(proc(text=[prompt], videos=[frames], video_metadata=[meta], return_tensors="pt",
                        do_sample_frames=False))
    return out


def _text_only(proc, text="describe the video"):
    return proc(text=[make_prompt(KIND, proc, text, None)], return_tensors="pt")


def test_one_mass_per_layer_and_argmax_suggestion(target, video_inputs):
    _, model, proc, visual_ids = target
    # A prompt-only sample in the mix is skipped, not counted.
    probe = probe_layers(model, [_text_only(proc), *video_inputs], visual_ids)

    assert probe.num_samples == 2
    masses = probe.text_to_visual
    assert len(masses) == NUM_LAYERS
    assert all(0.0 < m <= 1.0 for m in masses), masses  # text after the video does attend to it
    assert 1 <= probe.suggested_layer <= NUM_LAYERS - 1
    best = max(range(NUM_LAYERS - 1), key=lambda i: masses[i]) + 1  # last layer excluded
    assert probe.suggested_layer == best

    table = format_probe(probe).splitlines()
    marked = [line for line in table if "suggested" in line]
    assert len(marked) == 1 and marked[0].split()[0] == str(best)


def test_suggestion_skips_the_last_layer():
    # The last layer's output is the final hidden state: never the suggestion, even when it wins.
    assert suggest_layer([0.1, 0.3, 0.2, 0.9]) == 2
    assert suggest_layer([0.4, 0.9]) == 1
    assert suggest_layer([0.7]) == 1  # a single layer has nothing else to offer


def test_masses_match_hand_computation_from_output_attentions(target, video_inputs):
    _, model, _, visual_ids = target
    sample = video_inputs[0]
    probe = probe_layers(model, [sample], visual_ids)

    with torch.no_grad():
        attentions = model(**sample, output_attentions=True).attentions  # layers x [1, heads, n, n]
    ids = sample["input_ids"][0]  # [n]
    visual = torch.isin(ids, torch.tensor(visual_ids))  # [n]
    after = torch.arange(len(ids)) > visual.nonzero().min()  # [n]
    queries = ~visual & after  # [n] text positions after the video starts
    assert len(attentions) == NUM_LAYERS and queries.sum() > 0
    for layer, a in enumerate(attentions):
        # Per text query: 1 - mass on the non-visual keys, averaged over heads and queries.
        expected = (1 - a[0][:, queries][..., ~visual].sum(-1)).mean().item()  # heads x q -> []
        assert probe.text_to_visual[layer] == pytest.approx(expected, abs=1e-5)

    # The ids matter: the video's pads are not image pads, so with only the image id the
    # sample has no visual token at all.
    image_pad = min(visual_ids)  # 508 <|image_pad|>; 509 is the video pad
    assert image_pad not in ids.tolist()
    with pytest.raises(ValueError, match="no sample has visual tokens"):
        probe_layers(model, [sample], {image_pad})


def test_no_visual_samples_raise(target):
    _, model, proc, visual_ids = target
    with pytest.raises(ValueError, match="no sample has visual tokens"):
        probe_layers(model, [_text_only(proc), _text_only(proc, "what moves first?")], visual_ids)
    with pytest.raises(ValueError, match="no sample has visual tokens"):
        probe_layers(model, [], visual_ids)


def test_non_eager_model_is_rejected(target, video_inputs):
    from transformers import AutoModelForImageTextToText

    d, _, _, visual_ids = target
    sdpa = AutoModelForImageTextToText.from_pretrained(d, dtype=torch.float32, attn_implementation="sdpa")
    with pytest.raises(ValueError, match='attn_implementation="eager"'):
        probe_layers(sdpa.eval(), video_inputs, visual_ids)
    sdpa.set_attn_implementation("eager")  # the switch the message offers works in place
    assert probe_layers(sdpa, video_inputs[:1], visual_ids).num_samples == 1


def test_the_command_prints_the_table_and_the_capture_to_run_next(target, tmp_path):
    """`sparrow probe-layers` ended at its table; the next command (capture with --ivsb-layer) is
    now printed with the suggested layer filled in."""
    import json
    import re
    import subprocess
    import sys

    from sparrow_world.synthetic_clip import write_synthetic_clip

    d = target[0]
    clip = write_synthetic_clip(tmp_path / "c.mp4", 4, seed=3)
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"video": str(clip), "prompt": "describe the video", "response": "a square"}) + "\n")
    run = subprocess.run([sys.executable, "-m", "vllm_sparrow.cli", "probe-layers", "--target", str(d), "--data",
                          str(data), "--frames", "4"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    suggested = re.search(r"^\s*(\d+)\b.*<- suggested IVSB layer", run.stdout, re.M)
    assert suggested, run.stdout
    assert (f"next: sparrow capture --target {d} --data {data} --out CAPTURE --ivsb-layer {suggested.group(1)}"
            in run.stdout), run.stdout
