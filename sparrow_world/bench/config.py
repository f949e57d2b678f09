"""The benchmark's knobs, in one place."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from vllm_sparrow.knobs import knob

METHODS = ("none", "sparrow", "eagle", "eagle3", "ngram")
PAPER_LENGTHS = (512, 1536, 6144, 17408, 24960)  # visual tokens; ~0.5k, 1.5k, 6k, 17k, 25k
GRAPHS = ("auto", "on", "off")
MODELS = {"easy": "models/world", "hard": "models/world-hard"}  # each world's shipped demo models


@dataclass
class BenchConfig:
    """`sparrow bench`: every option is a field here (vllm_sparrow.knobs)."""

    # hard by default, as `sparrow demo` is: its drafts are as unsure as real captioners', so its
    # numbers are the ones a decision can rest on (docs/benchmarks.md, "The two demo worlds")
    world: str = knob("hard", "the demo world the clips come from and the captions are scored in: hard (real "
                              "choice, models/world-hard) or easy (one template, models/world: the test suite's "
                              "smoke world)", choices=("hard", "easy"))
    # None: the world's shipped demo model (models/world/... or models/world-hard/...)
    target: str | None = knob(None, "target model directory (default: the world's demo target)")
    sparrow: str | None = knob(None, "Sparrow draft directory (default: the world's demo draft)")
    eagle: str | None = knob(None, "EAGLE-style draft, vLLM's eagle format (default: the world's)")
    eagle3: str | None = knob(None, "EAGLE-3 draft, vLLM's eagle3 format (default: the world's)")
    out: str = knob("runs/bench", "records.jsonl (resumable), results.json, table.md, plot.png")
    lengths: tuple[int, ...] = knob(PAPER_LENGTHS, "visual tokens, comma separated")
    methods: tuple[str, ...] = knob(METHODS, "comma separated subset of " + ",".join(METHODS))
    ablations: dict[str, str] = knob(default_factory=dict, cli=False)  # name -> Sparrow draft dir
    clips_per_length: int = knob(2, "clips per length (batch size 1: one after another)", flag="--clips")
    batch_sizes: tuple[int, ...] = knob((1,), "comma separated; B > 1 submits B clips of a length together")
    # One round = every method measured once (its own engine). Timings on a shared machine drift and an
    # engine measured right after another's teardown runs slow: repeats in a rotated order make that
    # noise visible (the range) instead of a ranking (run.round_order).
    rounds: int = knob(3, "rounds: every method is measured once per round, each round in another order "
                          "(rotated, every other one reversed); speeds are the median over rounds, with their range")
    # None: the Sparrow draft's recommended depth (its config.json `speculative_tokens`), what the
    # plugin drafts when num_speculative_tokens is not given; resolved in __post_init__ so that
    # the settings (and the resume check) record the K actually run. Ablation drafts without
    # their own @K draft at this K too (like for like), not at their config.json's.
    num_speculative_tokens: int | None = knob(
        None, "speculative tokens K of every method: Sparrow and the EAGLE / EAGLE-3 / ngram baselines all draft "
              "at this one K, a like-for-like comparison (default: the Sparrow draft's recommended depth, its "
              "config.json speculative_tokens, as the plugin uses when K is not given)", flag="--k")
    max_tokens: int | None = knob(None, "longest caption (default: 320; the hard world's are 80-200 tokens with "
                                        "its own tokenizer)")
    seed0: int = knob(30_000_000, "first clip scene seed (disjoint from the demo models' training scenes)")
    prompt: str = knob("describe the video .", "the captioning prompt")
    # float32, not vLLM's "auto": auto downcasts a float32 checkpoint (the demo models are) to
    # bfloat16, which changes the greedy outputs the bench compares; on a GPU pass bfloat16.
    dtype: str = knob("float32", "dtype of the target and of every draft (vLLM's --dtype; its auto would "
                                 "downcast a float32 checkpoint such as the demo models; bfloat16 on a GPU)")
    cuda_graphs: str = knob("auto", "CUDA graphs for the target and the drafts: auto (on where the device is "
                                    "CUDA, off on CPU), on, off (vLLM's enforce_eager)", choices=GRAPHS)

    def __post_init__(self) -> None:
        from ..paths import in_checkout

        # The defaults name the shipped demo models relative to the checkout: found from any folder.
        models = MODELS[self.world]
        self.target, self.sparrow, self.eagle, self.eagle3 = (
            in_checkout(p or f"{models}/{name}") for p, name in (
                (self.target, "target"), (self.sparrow, "sparrow"), (self.eagle, "eagle"), (self.eagle3, "eagle3")))
        if self.max_tokens is None:
            self.max_tokens = 320
        if self.num_speculative_tokens is None:
            self.num_speculative_tokens = recommended_depth(self.sparrow)

    def settings(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}


def recommended_depth(draft: str | Path) -> int | None:
    """The Sparrow draft's recommended K (its config.json `speculative_tokens`), or None where no
    readable draft is there (a run of `--methods none` needs no K; a method that drafts is refused
    in engines.speculative_config)."""
    from vllm_sparrow.config import DraftConfigError, SparrowConfig

    try:
        return SparrowConfig.load(draft).speculative_tokens
    except DraftConfigError:
        return None


def enforce_eager(cfg: BenchConfig) -> bool:
    """vLLM's enforce_eager for cfg.cuda_graphs: "auto" captures graphs on CUDA only (on CPU,
    non-eager means a torch.compile of the model, minutes for nothing measured here)."""
    if cfg.cuda_graphs == "auto":
        from vllm.platforms import current_platform

        return not current_platform.is_cuda()
    return cfg.cuda_graphs == "off"


QUICK = {"lengths": (512, 1536), "clips_per_length": 1, "batch_sizes": (1, 2), "rounds": 2}  # what --quick sets


def quick(cfg: BenchConfig, keep: tuple[str, ...] = ()) -> BenchConfig:
    """CI smoke size: two short lengths, one clip each at batch 1 and two together, every method,
    two rounds, whole captions. keep: fields the user set, which --quick leaves as they are."""
    from dataclasses import replace

    return replace(cfg, **{k: v for k, v in QUICK.items() if k not in keep})
