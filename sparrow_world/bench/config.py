"""The benchmark's knobs, in one place."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from vllm_sparrow.cli_args import knob
from vllm_sparrow.config import SparrowConfig

METHODS = ("none", "sparrow", "eagle", "eagle3", "ngram")
PAPER_LENGTHS = (512, 1536, 6144, 17408, 24960)  # visual tokens; ~0.5k, 1.5k, 6k, 17k, 25k


@dataclass
class BenchConfig:
    """`sparrow bench`: every option is a field here (vllm_sparrow.cli_args)."""

    target: str = knob("models/world/target", "target model directory")
    sparrow: str = knob("models/world/sparrow", "Sparrow draft directory")
    eagle: str = knob("models/world/eagle", "EAGLE-style draft (vLLM's eagle format)")
    eagle3: str = knob("models/world/eagle3", "EAGLE-3 draft (vLLM's eagle3 format)")
    out: str = knob("runs/bench", "records.jsonl (resumable), results.json, table.md, plot.png")
    lengths: tuple[int, ...] = knob(PAPER_LENGTHS, "visual tokens, comma separated")
    methods: tuple[str, ...] = knob(METHODS, "comma separated subset of " + ",".join(METHODS))
    ablations: dict[str, str] = knob(default_factory=dict, cli=False)  # name -> Sparrow draft dir
    clips_per_length: int = knob(2, "clips per length (batch size 1: one after another)", flag="--clips")
    batch_sizes: tuple[int, ...] = knob((1,), "comma separated; B > 1 submits B clips of a length together")
    num_speculative_tokens: int = knob(SparrowConfig.speculative_tokens, "speculative tokens", flag="--k")
    max_tokens: int = knob(320, "longest caption")
    seed0: int = knob(30_000_000, "first clip scene seed (disjoint from the demo models' training scenes)")
    prompt: str = knob("describe the video .", "the captioning prompt")
    dtype: str = knob("float32", "engine dtype")

    def settings(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}


def quick(cfg: BenchConfig) -> BenchConfig:
    """CI smoke size: two short lengths, one clip each at batch 1 and two together, every method,
    whole captions (~4 min on CPU)."""
    from dataclasses import replace

    return replace(cfg, lengths=(512, 1536), clips_per_length=1, batch_sizes=(1, 2))
