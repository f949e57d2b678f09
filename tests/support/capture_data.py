"""The samples the engine-capture tests capture, on either vLLM release: three 4-frame clips (one
with two prompts, one answered by a given response, one by given token ids), an image (Qwen2.5-VL
only), a text-only prompt, a missing file and a 16-frame clip too long for max_seq_len 160."""

import json

import numpy as np
from PIL import Image


def capture_data(root, kind):
    from sparrow_world.synthetic_clip import write_synthetic_clip

    root.mkdir()
    for i in range(3):
        write_synthetic_clip(root / f"v{i}.mp4", 4, width=112, height=112, seed=i)
    write_synthetic_clip(root / "long.mp4", 16, width=112, height=112, seed=9)
    Image.fromarray(np.full((112, 112, 3), 90, np.uint8)).save(root / "im.png")
    rows = [
        {"video": "v0.mp4", "prompt": "describe the video"},
        {"video": "v0.mp4", "prompt": "what colour is the square?"},  # one decode for both, in one chunk
        {"video": "v1.mp4", "prompt": "what moves?", "response": "a red square moves left"},
        {"video": "missing.mp4", "prompt": "x"},
        {"prompt": "describe the red square moving left"},
        {"video": "v2.mp4", "prompt": "and now?", "response_ids": [40, 41, 42, 43]},
        {"video": "long.mp4", "prompt": "too many frames for max_seq_len"},
    ]
    if kind == "qwen2_5_vl":
        rows.insert(2, {"image": "im.png", "prompt": "what is in the picture"})
    (root / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root / "data.jsonl"
