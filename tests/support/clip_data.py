"""Small video datasets for capture and training tests: synthetic 4-frame clips on disk."""

from sparrow_world.synthetic_clip import write_synthetic_clip


def clip_rows(root, prompts, videos: int = 2) -> list[dict]:
    """Write `videos` clips per prompt under root; the JSONL rows that name them."""
    rows = []
    for v in range(videos):
        for j, text in enumerate(prompts):
            write_synthetic_clip(root / f"v{v}{j}.mp4", 4, width=112, height=112, seed=10 * v + j)
            rows.append({"video": f"v{v}{j}.mp4", "prompt": text})
    return rows
