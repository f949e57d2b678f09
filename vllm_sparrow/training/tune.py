"""`sparrow tune`: the draft's depth per batch size, chosen from this machine's measured costs and
the draft's held-out acceptance, written into its config.json for the plugin to serve.

    sparrow tune --draft DRAFT --capture CAP [--batch-sizes 1,4,16,64] [--write]

1. Cost (step_cost.py): vLLM serves the draft at `cost_points` depths from 1 to `max_depth` on
   this machine (the least-squares line through them prices every depth),
   with the held-out samples' own prompts (their videos, so the verify step attends over the
   context users send), and times the decode steps at each batch size and the drafter's share of
   them, so one more drafted token's cost is known as a draft forward's and a verified token's;
   each depth's engine is started `rounds` times and its fastest start counts.
2. Replay (acceptance.py), once the engines are closed: the draft drafts chains of `max_depth`
   tokens on the capture's held-out tail, which gives the expected tokens per step at every
   depth (depth.py); and trees of `tree_nodes` nodes from an EAGLE-2 search (tree_replay.py).
3. Choice: at each batch size, the depth with the most tokens per unit of step cost; written as
   vLLM's num_speculative_tokens_per_batch_size schedule (`depth_per_batch_size`) and the batch-1
   depth as `speculative_tokens`. A user's own num_speculative_tokens or schedule still wins.
   Beside it, per batch size, whether verifying a tree would pay at these draft and verify costs
   (depth.tree_verdict: vLLM verifies chains only, so this is reported, not served), and what the
   same replay would choose on a reference GPU's costs (gpu_costs.py).
4. Stop threshold: adaptive length (`stop_confidence`) calibrated on the same held-out samples at
   the batch-1 depth, with batch 1's measured cost of a drafted token as the price of verifying
   one (`sparrow calibrate-stop`'s choice, from this machine's costs instead of a guess); None
   (off) where drafting every token scores best. The config holds one threshold for every batch
   size, and batch 1 is where users wait on a single request.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import MAX_SPECULATIVE_TOKENS
from ..knobs import knob

if TYPE_CHECKING:  # the config stays importable without torch (`sparrow --help`)
    from .acceptance import AcceptanceEstimate


def batch_sizes(text: str) -> tuple[int, ...]:
    sizes = tuple(sorted({int(s) for s in str(text).split(",") if s.strip()}))
    if not sizes or sizes[0] != 1:
        raise argparse.ArgumentTypeError(f"must include 1 (vLLM's schedule starts there), got {text!r}")
    return sizes


def cost_depths(max_depth: int, points: int) -> tuple[int, ...]:
    """`points` depths evenly spaced from 1 to max_depth, e.g. (16, 3) -> (1, 8, 16)."""
    if points < 2 or max_depth < 2:
        raise ValueError(f"cost_points={points}, max_depth={max_depth}: the cost line needs two depths at least")
    return tuple(sorted({1 + (i * (max_depth - 1)) // (points - 1) for i in range(points)}))


def node_counts(text: str) -> tuple[int, ...]:
    return tuple(sorted({int(s) for s in str(text).split(",") if s.strip()}))


@dataclass
class TuneConfig:
    """`sparrow tune`: every option is a field here (knobs.py)."""

    draft: str = knob(help="Sparrow draft directory (its config.json gets the depths with --write)")
    capture: str = knob(help="capture of the draft's target; its last --samples samples are the held-out replay")
    data: str | None = knob(None, "JSONL whose samples' prompts the cost is measured with (default: the data the "
                                  "capture was made from; its last --samples lines)")
    samples: int = knob(8, "held-out samples (the capture's and the data's last ones)")
    batch_sizes: tuple[int, ...] = knob((1, 4, 16, 64), parse=batch_sizes,
                                        help="batch sizes to measure, comma-separated, from 1 (each one's depth serves "
                                       "up to the next)")
    max_depth: int = knob(MAX_SPECULATIVE_TOKENS, "deepest depth considered (the replay's depth and the deepest "
                                                  "one timed)")
    cost_points: int = knob(3, "depths timed, evenly spaced from 1 to max_depth (at least 2): each drafted token "
                               "is priced by the least-squares line through them, and its worst miss is reported")
    tree_nodes: tuple[int, ...] = knob((8, 16, 32), parse=node_counts,
                                       help="tree sizes whose verification is priced against the chain, "
                                            "comma-separated (empty: none)")
    tree_topk: int = knob(4, "children per node of the replayed tree search")
    tree_search_depth: int = knob(8, "levels of the replayed tree search (a tree's sequential draft forwards)")
    steps: int = knob(12, "decode steps timed per batch size and depth")
    rounds: int = knob(2, "engine starts per depth, alternating depths; each depth costs its fastest start's "
                          "time (engines vary from start to start)")
    num_frames: int | None = knob(None, "frames per video, as served (default: the capture's, so the steps are timed "
                                        "at the context the replay measured)", flag="--frames")
    write: bool = knob(False, "store the schedule and the batch-1 depth in the draft's config.json")
    out: str | None = knob(None, "also write the measurements and the choice as JSON here")
    cpu_kv_cache_gib: int = knob(4, "KV cache per engine in GiB on a CPU machine when VLLM_CPU_KVCACHE_SPACE is "
                                    "unset (vLLM's CPU default sizes it from free memory, which tune's next engine "
                                    "can find short); a GPU ignores it")
    engine_args: dict[str, Any] = knob(default_factory=dict, help='extra LLM(...) arguments as JSON: the settings '
                                       'you serve with (dtype, enforce_eager, ...), since the costs are the serving '
                                       'engine\'s, e.g. {"max_model_len": 32768, "dtype": "float32", '
                                       '"enforce_eager": true}')


@dataclass
class TuneResult:
    replay: AcceptanceEstimate
    tokens_per_step: list[float]  # [max_depth] expected tokens per step drafting 1..max_depth
    costs: list[dict] = field(default_factory=list)  # step_cost.describe rows
    trees: dict[str, Any] = field(default_factory=dict)  # the tree replay and, per batch size, the tree verdict
    reference: dict[str, Any] = field(default_factory=dict)  # what the same replay chooses on gpu_costs.COSTS
    schedule: list[list[int]] = field(default_factory=list)  # [[first batch, last, depth], ...]
    stop_confidence: float | None = None  # adaptive length's threshold; None: off
    stop_scores: dict[str, float] = field(default_factory=dict)  # threshold ("off") -> tokens per unit cost

    def summary(self) -> str:
        tokens = ", ".join(f"{t:.2f}" for t in self.tokens_per_step)
        rows = [f"held-out tokens per step at depth 1..{len(self.tokens_per_step)}: {tokens}"]
        depth_at = {b: d for lo, hi, d in self.schedule for b in range(lo, hi + 1)}
        for c in self.costs:
            depth = depth_at.get(c["batch"], self.schedule[-1][2])
            rows.append(f"batch {c['batch']}: {c['fixed_ms']:.2f} ms per step + {c['per_token_ms']:.2f} ms per drafted "
                        f"token ({c['per_token_cost']:.3f} of a step: draft {c['draft_token_cost']:.3f}, verify "
                        f"{c['verify_token_cost']:.3f}; the line misses a timed depth by {c['line_miss']:.1%} at most) "
                        f"-> depth {depth}")
            verdict = self.trees.get("verdicts", {}).get(str(c["batch"]))
            if verdict:
                rows.append(f"  tree verification (not served: vLLM verifies chains) would be best as "
                            f"{verdict['best']}; break-even verify cost per tree: {verdict['break_even_v']}")
        rows.append(f"num_speculative_tokens_per_batch_size: {json.dumps(self.schedule)}")
        if self.reference:
            rows.append(f"on the {self.reference['name']}, it would be {json.dumps(self.reference['schedule'])}"
                        + (f" (tree verification best there as {self.reference['trees']})" if self.reference.get("trees")
                           else ""))
        scores = ", ".join(f"{t} {v:.3f}" for t, v in self.stop_scores.items())
        rows.append(f"stop_confidence: {self.stop_confidence} (tokens per unit cost at batch 1: {scores})")
        return "\n".join(rows)


def tune(cfg: TuneConfig, progress=print) -> TuneResult:
    from .acceptance import calibrate_stop_confidence, estimate_acceptance
    from .depth import choose_depth, depth_schedule
    from .step_cost import describe, measure_step_costs

    settings = _capture_settings(cfg.capture)  # a clear error for a folder that is no capture
    requests, params = _requests(cfg, settings)
    try:
        costs = measure_step_costs(lambda depth: _engine(cfg, settings["target"], depth), requests, params,
                                   cfg.batch_sizes, cost_depths(cfg.max_depth, cfg.cost_points), cfg.steps, progress,
                                   cfg.rounds)
    except Exception as e:  # vLLM's validation error for a video its token budget cannot hold
        if "encoder cache" not in str(e):
            raise
        raise ValueError(f"{e}\nsparrow tune times the capture's whole videos (--frames, default the capture's): "
                         "give the engine room for them, e.g. --engine-args '{\"max_num_batched_tokens\": N, "
                         "\"max_model_len\": M}' with N at least a video's tokens times the largest batch size "
                         "and M a video's tokens plus the prompt and answer, or pass fewer --frames") from e
    # the replays after the engines are gone: the transformers target is a second whole copy of
    # the target's weights, never held beside vLLM's
    draft, target, held_out = _held_out(cfg, settings["target"])
    est = estimate_acceptance(draft, target, held_out, cfg.max_depth)
    tokens = choose_depth(est, 0.0, 0.0).tokens_per_step
    progress(f"replay: {est.drafts} drafts, tokens per step at depth {cfg.max_depth}: {tokens[-1]:.2f}")
    result = TuneResult(est, tokens, costs=describe(costs),
                        schedule=depth_schedule(est, {c.batch: (c.draft_token, c.verify_token) for c in costs}))
    if cfg.tree_nodes:
        result.trees = _tree_verdicts(cfg, draft, target, held_out, tokens, costs, progress)
    result.reference = _on_reference_gpu(est, tokens, result.trees)
    depth, batch1 = result.schedule[0][2], next(c for c in costs if c.batch == 1)
    # at batch 1 a chain that stops saves both the draft forward and the verification of each token
    # it does not draft: their sum is the price
    stop, scores = calibrate_stop_confidence(draft, target, held_out, depth, batch1.per_token)
    result.stop_confidence, result.stop_scores = stop, {str(t): v for t, v in scores.items()}
    progress(f"stop_confidence at depth {depth}: {stop if stop is not None else 'off (drafting every token scores best)'}")
    if cfg.write:
        _write(cfg.draft, result.schedule, stop)
    if cfg.out:
        from ..durable import atomic_write_json

        atomic_write_json(Path(cfg.out), {"draft": cfg.draft, "capture": cfg.capture, "max_depth": cfg.max_depth,
                                          "replay": {"drafts": est.drafts, "per_position": est.per_position},
                                          "tokens_per_step": tokens, "costs": result.costs, "trees": result.trees,
                                          "reference": result.reference,
                                          "schedule": result.schedule, "stop_confidence": stop,
                                          "stop_scores": result.stop_scores})
    return result


def _tree_verdicts(cfg: TuneConfig, draft, target, held_out, tokens: list[float], costs, progress) -> dict:
    """The tree replay on the held-out samples and, at each batch size's measured draft and verify
    costs, the tree verdict (depth.tree_verdict: chains of every depth against each tree, which
    takes max_depth draft forwards and verifies its N nodes)."""
    from dataclasses import asdict

    from .depth import tree_verdict
    from .tree_replay import replay_trees

    replay = replay_trees(draft, target, held_out, cfg.max_depth, cfg.tree_topk, cfg.tree_nodes,
                          search_depth=cfg.tree_search_depth)
    chains = {k: t for k, t in enumerate(tokens, 1)}
    trees = {n: (replay.tau("tree", n), replay.search_depth) for n in cfg.tree_nodes}
    verdicts = {}
    for c in costs:
        v = tree_verdict(chains, trees, c.draft_token, c.verify_token)
        verdicts[str(c.batch)] = {**asdict(v), "best": v.best}
    progress(f"tree replay: {replay.points} verify points, tau " +
             ", ".join(f"tree {n} {t:.2f}" for n, (t, _) in trees.items()))
    return {"topk": cfg.tree_topk, "search_depth": replay.search_depth, "points": replay.points,
            "tau": {str(n): t for n, (t, _) in trees.items()}, "verdicts": verdicts}


def _on_reference_gpu(est, tokens: list[float], trees: dict) -> dict:
    """The depth schedule (and, with the tree replay, each batch size's best plan) the same replay
    gives on the reference GPU's costs (gpu_costs.py), beside this machine's."""
    from . import gpu_costs
    from .depth import depth_schedule, tree_verdict

    out: dict[str, Any] = {"name": gpu_costs.NAME, "costs": {str(b): list(c) for b, c in gpu_costs.COSTS.items()},
                           "schedule": depth_schedule(est, gpu_costs.COSTS)}
    if trees:
        chains = {k: t for k, t in enumerate(tokens, 1)}
        plans = {int(n): (t, trees["search_depth"]) for n, t in trees["tau"].items()}
        out["trees"] = {str(b): tree_verdict(chains, plans, *c).best for b, c in gpu_costs.COSTS.items()}
    return out


def _held_out(cfg: TuneConfig, target_dir: str):
    """The draft, the target's head and embeddings, and the capture's last --samples samples."""
    from ..checkpoint import load_draft
    from .shards import ShardReader
    from .target_runner import HFTarget

    reader = ShardReader(cfg.capture)
    held_out = [reader[i] for i in range(max(0, len(reader) - cfg.samples), len(reader))]
    return load_draft(cfg.draft), HFTarget(target_dir), held_out


def _requests(cfg: TuneConfig, settings: dict) -> tuple[list[dict], Any]:
    """The held-out samples as vLLM requests (chat prompt + decoded media), and greedy params
    long enough that no request ends inside the timed steps."""
    from vllm import SamplingParams

    from .data import Sample, load_media, read_samples
    from .respond import templater_for

    data = cfg.data or settings["data"]
    if not Path(data).is_file():
        raise ValueError(f"{data} (the data the capture was made from) is not there from this folder: pass --data")
    good = [s for s in read_samples(data) if isinstance(s, Sample)][-cfg.samples:]
    if not good:
        raise ValueError(f"{data} has no usable sample to measure the step cost with")
    template = templater_for(settings["target"])
    requests = []
    for sample in good:
        request: dict[str, Any] = {"prompt": template(sample)}
        if sample.media_kind is not None:
            # a verified token's cost grows with the context it attends over: time it at the
            # capture's frames unless told (a 16-frame default timed the hard draft's 6,144-token
            # replay at a far shorter context, and chose depths the served length could not afford)
            frames = cfg.num_frames or settings.get("num_frames", 16)
            request["multi_modal_data"] = {sample.media_kind: load_media(sample, frames)}
        requests.append(request)
    max_tokens = (cfg.steps + 8) * (cfg.max_depth + 1)
    return requests, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def _engine(cfg: TuneConfig, target: str, depth: int):
    from .. import envs
    from ..batch_caption import open_engine
    from ..engine_stats import EXTENSION

    spec = {"method": "sparrow", "model": cfg.draft, "num_speculative_tokens": depth}
    # the drafter's timer is read across processes by name (engine_stats.StatsWorkerExtension)
    args = dict(limit_mm_per_prompt={"video": 1, "image": 1}, max_num_seqs=max(cfg.batch_sizes),
                speculative_config=spec, worker_extension_cls=EXTENSION)
    # step_cost times engine.step(): the core must run inside it
    with envs.engine_core_in_this_process(), envs.cpu_kv_cache_unless_set(cfg.cpu_kv_cache_gib):
        return open_engine(target, {**args, **cfg.engine_args})


def _capture_settings(capture: str) -> dict:
    from .shards import load_manifest

    manifest = load_manifest(Path(capture))
    if manifest is None:
        raise ValueError(f"{capture} is not a capture (no manifest): pass the folder `sparrow capture` wrote")
    return manifest.settings


def _write(draft: str, schedule: list[list[int]], stop_confidence: float | None) -> None:
    from ..config import SparrowConfig

    cfg = SparrowConfig.load(draft)
    cfg.depth_per_batch_size = schedule
    cfg.speculative_tokens = schedule[0][2]
    cfg.stop_confidence = stop_confidence
    cfg.save(draft)
