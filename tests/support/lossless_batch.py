"""The lossless matrix's batch, one definition for every runner's engine test
(test_greedy_lossless_per_target on vLLM 0.32's V1 runner, test_v2_runner_greedy_outputs_are_the_targets
on 0.34's V2 runner): per target a long and a short video, an image, a text prompt longer than the
draft's window and short text prompts, and the squeezed engine settings under which prompts are
chunked, requests preempted and recomputed, and more requests pass than there are draft slots."""

import math

import numpy as np
from conftest import TRAINED_TEXTS
from vllm import SamplingParams

from sparrow_world.tiny_targets import make_prompt

K = 3
MAX_TOKENS = 40
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
# (long, short) video frame counts per target; None: a text-only target.
FRAMES = {"qwen2_5_vl": (64, 4), "qwen2_vl": (64, 4), "qwen3_vl": (64, 4),
          "llava_onevision": (32, 4), "llama": None}
QUESTION = "describe the video"
# Longer than the draft's window (64 text tokens): the window slides inside the prompt itself.
LONG_TEXT = " ".join(f"then the {c} {s} moves {d}" for c, s, d in zip(
    ["red", "blue", "green", "yellow", "white"] * 5, ["square", "circle", "star", "line", "dot"] * 5,
    ["left", "right", "up", "down", "round"] * 5))
MORE_TEXTS = ["a green triangle turns around", "what happens after the red square", "the yellow dot stops"]
# The squeezed sparrow engine: 600 tokens a step on vision targets (the long videos' 512 visual
# tokens fit one step; their prompts and the rest are chunked), 96 on text ones, 4 draft slots for
# 6-9 requests, and a KV cache that holds the longest request with little to spare (preemptions).
SEQS, BLOCK = 4, 32
# Accepted draft tokens measured on each target's batch (2026-12-01); a broken draft falls far below.
ACCEPTED = {"qwen2_5_vl": 63, "qwen2_vl": 58, "qwen3_vl": 67, "llava_onevision": 62, "llama": 60}


def requests(kind, target, clips):
    texts = [{"prompt": make_prompt(kind, target, t, None)} for t in [*TRAINED_TEXTS, LONG_TEXT, *MORE_TEXTS]]
    if FRAMES[kind] is None:
        return texts
    long_f, short_f = FRAMES[kind]
    rng = np.random.default_rng(0)
    image = rng.integers(0, 255, (112, 112, 3), dtype=np.uint8)
    from PIL import Image

    reqs = [
        {"prompt": make_prompt(kind, target, QUESTION, "video"), "multi_modal_data": {"video": clips(long_f)}},
        {"prompt": make_prompt(kind, target, QUESTION, "video"), "multi_modal_data": {"video": clips(short_f)}},
        {"prompt": make_prompt(kind, target, "what is in the picture", "image"),
         "multi_modal_data": {"image": Image.fromarray(image)}},
    ]
    return reqs + texts


def squeezed(kind, outputs) -> dict:
    """Engine settings under which the longest request fits with two blocks to spare."""
    longest = max(len(o.prompt_token_ids) + MAX_TOKENS + K for o in outputs)
    blocks = math.ceil(longest / BLOCK) + 2
    budget = 600 if FRAMES[kind] else 96
    return dict(max_num_seqs=SEQS, max_num_batched_tokens=budget, block_size=BLOCK,
                num_gpu_blocks_override=blocks + 1, max_model_len=blocks * BLOCK)  # (+ vLLM's null block)


def sparrow_spec(draft) -> dict:
    """The speculative config the V2 runner's engine and server tests serve the draft with."""
    return {"method": "sparrow", "model": str(draft), "num_speculative_tokens": K}
