"""The benchmark's knobs, in one place."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

METHODS = ("none", "sparrow", "eagle", "eagle3", "ngram")
PAPER_LENGTHS = (512, 1536, 6144, 17408, 24960)  # visual tokens; ~0.5k, 1.5k, 6k, 17k, 25k


@dataclass
class BenchConfig:
    target: str = "models/world/target"
    sparrow: str = "models/world/sparrow"
    eagle: str = "models/world/eagle"
    eagle3: str = "models/world/eagle3"
    out: str = "runs/bench"  # records.jsonl (resumable), results.json, table.md, plot.png
    lengths: tuple[int, ...] = PAPER_LENGTHS
    methods: tuple[str, ...] = METHODS
    ablations: dict[str, str] = field(default_factory=dict)  # name -> Sparrow draft dir
    clips_per_length: int = 2  # at batch size 1, captioned one after another
    batch_sizes: tuple[int, ...] = (1,)  # B > 1: B clips of a length submitted together
    num_speculative_tokens: int = 3
    max_tokens: int = 320
    seed0: int = 30_000_000  # clip scenes; disjoint from the demo models' training scenes
    prompt: str = "describe the video ."
    dtype: str = "float32"

    def settings(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}


def quick(cfg: BenchConfig) -> BenchConfig:
    """CI smoke size: two short lengths, one clip each at batch 1 and two together, every method,
    whole captions (~4 min on CPU)."""
    from dataclasses import replace

    return replace(cfg, lengths=(512, 1536), clips_per_length=1, batch_sizes=(1, 2))
