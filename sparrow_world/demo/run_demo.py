"""`make demo`: caption the bundled world clips with vLLM, without and with Sparrow.

For each clip: the caption, whether it equals the target's own greedy caption token for token,
and (vs. the scene's true caption) how much of it is right; then the mean acceptance length and
the decode speedup of Sparrow against no speculation, measured in this run on this machine.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from vllm_sparrow.durable import atomic_write_json
from vllm_sparrow.logs import logs_to

from ..paths import REPO

MODELS = REPO / "models" / "world-hard"  # `sparrow demo`'s default world
SAMPLES = REPO / "examples" / "videos"


def sample_clips(folder: Path = SAMPLES) -> list[dict]:
    """The bundled clips: samples.json lists file, visual tokens and true caption."""
    index = folder / "samples.json"
    if not index.exists():
        raise SystemExit(f"{index} is missing: run `sparrow demo samples` to write the sample clips")
    return [dict(row, path=folder / row["file"]) for row in json.loads(index.read_text())]


def run_demo(models: Path = MODELS, max_tokens: int = 320, log: Path | None = None, world: str = "hard") -> int:
    """Returns 0 when every caption with sparrow equals the target's own. log: where vLLM's
    output goes (None: to the terminal with the report). world: how the models caption (the
    bundled clips are scenes of both worlds; the hard world scores captions by meaning)."""
    if log is not None:
        print(f"vLLM's logs: {log}", flush=True)
    with logs_to(log) as out:
        return _run(models, max_tokens, out, world)


def _run(models: Path, max_tokens: int, out, world: str) -> int:
    from transformers import AutoTokenizer

    from ..bench.config import BenchConfig
    from ..bench.engines import close_engine, generate_one, open_engine
    from vllm_sparrow.config import SparrowConfig
    from vllm_sparrow.engine_stats import spec_counters
    from ..tiny_targets import make_prompt
    from vllm_sparrow.video import decode_video

    for part in ("target", "sparrow"):
        if not (models / part / "config.json").exists():
            raise SystemExit(f"{models / part} is missing; rebuild the demo models with "
                             f"`sparrow demo build --world {world}`")
    clips = sample_clips()
    k = SparrowConfig.load(models / "sparrow").speculative_tokens  # the draft's recommended depth
    cfg = BenchConfig(world=world, target=str(models / "target"), sparrow=str(models / "sparrow"),
                      max_tokens=max_tokens, num_speculative_tokens=k)
    tok = AutoTokenizer.from_pretrained(cfg.target)
    prompt = make_prompt("qwen2_5_vl", tok, cfg.prompt, media="video")
    requests = [{"prompt": prompt, "multi_modal_data": {"video": decode_video(c["path"])}} for c in clips]
    longest = max(c["visual_tokens"] for c in clips)
    results, counters = {}, None
    for method in ("none", "sparrow"):
        t0 = time.perf_counter()
        llm = open_engine(method, cfg, longest)
        print(f"engine ({'no speculation' if method == 'none' else 'sparrow'}) ready in "
              f"{time.perf_counter() - t0:.0f}s", file=out, flush=True)
        try:
            generate_one(llm, requests[0], 8)  # warm-up
            before = spec_counters(llm) if method == "sparrow" else None
            results[method] = [generate_one(llm, r, max_tokens) for r in requests]
            if before is not None:
                after = spec_counters(llm)
                counters = {k: after[k] - before[k] for k in ("num_drafts", "num_accepted_tokens")}
        finally:
            close_engine(llm)
    _print(clips, results, counters, tok, out, k, world)
    return 0 if all(a["token_ids"] == b["token_ids"] for a, b in zip(results["none"], results["sparrow"])) else 1


def _print(clips, results, counters, tok, out, k: int, world: str) -> None:
    print(file=out)
    for c, base, spec in zip(clips, results["none"], results["sparrow"]):
        quality = _quality(tok, c, spec["token_ids"], world)
        same = "identical" if base["token_ids"] == spec["token_ids"] else "DIFFERENT (bug: please report)"
        print(f"--- {c['file']}: {c['seconds']} s, {c['visual_tokens']} visual tokens, "
              f"{base['prompt_tokens']} prompt tokens", file=out)
        print(f"caption with sparrow: {spec['text']}", file=out)
        print(f"  {same} to the target's greedy caption without speculation; {quality}", file=out)
        print(f"  decode: {_tps(base)} tok/s without, {_tps(spec)} tok/s with sparrow", file=out)
    base_s = sum(r["decode_s"] for r in results["none"])
    spec_s = sum(r["decode_s"] for r in results["sparrow"])
    if counters and counters["num_drafts"]:
        print(f"\nmean acceptance length (incl. bonus token, K={k}, the draft's recommended depth): "
              f"{1 + counters['num_accepted_tokens'] / counters['num_drafts']:.2f}", file=out)
    print(f"decode speedup vs no speculation (same run, this machine's CPU, batch size 1): "
          f"{base_s / spec_s:.2f}x", file=out)


def _quality(tok, clip: dict, token_ids: list[int], world: str) -> str:
    """How right a caption is: against the scene's true caption (easy world) or, where a scene
    has many right captions (hard world), against the facts the scene allows."""
    from ..bench.run import caption_accuracy
    from ..world import WorldConfig, sample_scene
    from ..world.languages import language

    words = language(world)
    scene = sample_scene(clip["seed"], WorldConfig(duration_s=clip["seconds"]))
    if words.scene_facts is None:
        acc = caption_accuracy(tok, [token_ids], [words.caption(scene)])
        return (f"word accuracy against the true caption {100 * acc['caption_word_accuracy']:.0f}%, "
                f"objects named right {100 * acc['object_recall']:.0f}%")
    acc = caption_accuracy(tok, [token_ids], [words.caption(scene)], [frozenset(words.scene_facts(scene))])
    return (f"facts right {100 * acc['caption_fact_accuracy']:.0f}% (of those said and those missed), "
            f"objects named right {100 * acc['object_recall']:.0f}%")


def _tps(r: dict) -> str:
    return f"{(len(r['token_ids']) - 1) / r['decode_s']:.1f}" if r["decode_s"] > 0 else "-"


def write_samples(folder: Path = SAMPLES, seconds=(32, 96, 384), seed0: int = 40_000_000) -> None:
    """Write the bundled clips and samples.json (scenes the demo models never trained on)."""
    from ..world import WorldConfig, caption, sample_scene, write_scene

    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, s in enumerate(seconds):
        cfg = WorldConfig(duration_s=s)
        scene = sample_scene(seed0 + i, cfg)
        name = f"world_{s}s.mp4"
        write_scene(scene, folder / name)
        rows.append({"file": name, "seconds": s, "visual_tokens": cfg.visual_tokens_qwen25vl(),
                     "caption": caption(scene), "seed": seed0 + i})
    atomic_write_json(folder / "samples.json", rows)
