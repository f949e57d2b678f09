"""Small video datasets for capture and training tests: synthetic 4-frame clips on disk."""

import json

from sparrow_world.synthetic_clip import write_synthetic_clip


def dataset(root, clips, rows: list[dict]):
    """root/data.jsonl of `rows`, whose "video" names a file of `clips` (conftest's small_clips)
    where that folder has it (written as an absolute path), else one relative to root (a missing
    or broken file the test writes there). Returns the JSONL's path."""
    root.mkdir(parents=True, exist_ok=True)
    named = [{**r, "video": str(clips / r["video"])} if "video" in r and (clips / r["video"]).exists() else r
             for r in rows]
    (root / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in named))
    return root / "data.jsonl"


def clip_rows(root, prompts, videos: int = 2) -> list[dict]:
    """Write `videos` clips per prompt under root; the JSONL rows that name them."""
    rows = []
    for v in range(videos):
        for j, text in enumerate(prompts):
            write_synthetic_clip(root / f"v{v}{j}.mp4", 4, width=112, height=112, seed=10 * v + j)
            rows.append({"video": f"v{v}{j}.mp4", "prompt": text})
    return rows
