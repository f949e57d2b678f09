"""Write models/world/README.md (the model card) from what the build and the benchmark recorded:
`sparrow demo card --bench runs/bench` after `sparrow demo build` and `sparrow bench`."""

from __future__ import annotations

import json
from pathlib import Path

from vllm_sparrow.durable import atomic_write_text, read_jsonl


def _params(folder: Path) -> int:
    from safetensors import safe_open

    total = 0
    for f in folder.glob("*.safetensors"):
        with safe_open(str(f), "pt") as st:
            for k in st.keys():
                total += _prod(st.get_slice(k).get_shape())
    return total


def _prod(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def target_accuracy(target: Path, world: str = "easy") -> dict:
    """`train_target.evaluate` on the training run's held-out scenes, with the shipped weights."""
    import torch
    from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

    from ..tiny_targets import make_prompt
    from ..world import WorldConfig
    from ..world.languages import language
    from .target_data import WorldBatches
    from .train_target import EVAL_SEED0, LONG_EVAL_SCENES, LONG_EVAL_SECONDS, evaluate

    tok = AutoTokenizer.from_pretrained(target)
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(target, dtype=torch.float32)
    words = language(world)
    data = WorldBatches(tok, make_prompt("qwen2_5_vl", tok, words.prompt, media="video"), words)
    short = [data.sample(EVAL_SEED0 + i, WorldConfig(duration_s=16)) for i in range(32)]
    long = [data.sample(EVAL_SEED0 + i, WorldConfig(duration_s=LONG_EVAL_SECONDS)) for i in range(LONG_EVAL_SCENES)]
    return evaluate(model, data, short, batch_size=8, long_samples=long)


def _recommended_depth(models: Path) -> int:
    return json.loads((models / "sparrow" / "config.json").read_text())["speculators_config"]["proposal_methods"][0][
        "speculative_tokens"]


PUBLISHED = {"easy": "k3", "hard": "hard-k5"}  # benchmarks/publish.py's run of each world's table
DEPTH_TEXT = {"easy": "measured in docs/benchmarks.md, Depth",
              "hard": "the build's setting; `sparrow tune` measures the depth per batch size on a machine"}
WORLD_TEXT = {"easy": "one template, one right caption per scene",
              "hard": "near-even choices of sentence shape, synonyms and optional clauses, counts and event times"}
STRUCT_TEXT = {
    "easy": "`struct` words come from the caption's template; `colour` (which colour comes next), `shape`, `size` and "
            "`motion` can only come from the video, so a blank video drops them to the text prior.",
    "hard": "`struct` words are the phrasing; `colour`, `shape` and `count` have one right word each, so they show "
            "what the target reads from the video; `size`, `motion` and `time` words have synonyms drawn near-evenly, "
            "so teacher-forced accuracy on them is capped by the choice (the benchmark scores captions by meaning)."}


def models_arg(models: Path) -> str:
    """The --models argument that names `models` (relative to the checkout where it is inside)."""
    from ..paths import REPO

    try:
        return str(models.resolve().relative_to(REPO))
    except ValueError:
        return str(models)


def _long_stage(long: dict, log_path: Path) -> list[str]:
    """The card's bullet for the long stage (the hard world's), with what its log says it changed
    between its first and last eval; nothing when the build had none."""
    if not long.get("steps"):
        return []
    line = (f"- Then a long stage of {long['steps']} batch-1 steps on real clips of "
            f"{', '.join(str(d) for d in long['durations'])} s (up to {long['durations'][-1] * 16:,} visual tokens, "
            f"the lengths the benchmark measures at), vision tower frozen, AdamW lr {long['lr']}")
    evals = read_jsonl(log_path) if log_path.exists() else []
    if len(evals) < 2:
        return [line + "."]
    first, last = evals[0]["long"], evals[-1]["long"]
    changed = "; ".join(f"{k}: {first[k]['facts']['caption_fact_accuracy']:.3f} -> "
                        f"{last[k]['facts']['caption_fact_accuracy']:.3f} ({first[k]['caption_tokens']:.0f} -> "
                        f"{last[k]['caption_tokens']:.0f} tokens)" for k in last if k in first)
    return [line + f". Greedy caption fact accuracy on {long['eval_scenes']} held-out scenes, "
            f"step {evals[0]['step']} -> {evals[-1]['step']}: {changed}."]


def stage1_summary(build: dict, models: Path, work: Path) -> dict:
    """Stage 1's (main stage and extension) last eval: step, minutes and vision heads, from its
    log in <work>/target when there is one, else from build.json's record of it (a checkout
    ships the target and build.json, not the log)."""
    from .build import STAGE1_RECORD
    from .train_target import stage1_record

    summary = stage1_record(work / "target") or build.get(STAGE1_RECORD)
    if summary is None:
        raise SystemExit(f"the card needs the target's stage-1 training record (last eval's step, minutes and vision "
                         f"heads): {work / 'target' / 'train_log.jsonl'} is missing and {models / 'build.json'} has "
                         f"no {STAGE1_RECORD!r}; pass the build's --workdir, or rebuild the target")
    return summary


def write_card(models: Path, work: Path, bench: Path | None) -> Path:
    build = json.loads((models / "build.json").read_text())
    last = stage1_summary(build, models, work)
    cfg = build["config"]
    t = cfg["target"]
    ext = t["extension"]
    world = cfg.get("world", "easy")
    flag = f" --world {world}"  # every command names its world: their defaults are the hard one
    lines = [
        "# World demo models: target captioner, Sparrow draft, EAGLE-1-style and EAGLE-3 baselines",
        "",
        f"Trained from scratch on this project's synthetic video world (`sparrow_world/world`), the {world} world's"
        f" captions ({WORLD_TEXT[world]}), by `sparrow demo build` on a 2-core CPU. Regenerate everything"
        " (resumable):",
        "",
        f"    make setup && .venv/bin/sparrow demo build{flag} --models {models_arg(models)} --workdir {models_arg(work)}",
        f"    .venv/bin/sparrow bench{flag} --with-ablations --out runs/bench && .venv/bin/sparrow demo card{flag}"
        " --bench runs/bench",
        "",
        "| part | folder | parameters | format |",
        "|---|---|---|---|",
        f"| target | target/ | {_params(models / 'target') / 1e6:.2f}M | Qwen2_5_VLForConditionalGeneration (HF + vLLM) |",
        f"| Sparrow draft | sparrow/ | {_params(models / 'sparrow') / 1e6:.2f}M (+ target embeddings/head, shared) "
        "| vllm-sparrow `method: sparrow` |",
        f"| EAGLE baseline | eagle/ | {_params(models / 'eagle') / 1e6:.2f}M | vLLM `method: eagle` |",
        f"| EAGLE-3 baseline | eagle3/ | {_params(models / 'eagle3') / 1e6:.2f}M (+ target embeddings, shared) "
        "| vLLM `method: eagle3` |",
        "",
        "## Target",
        f"- {cfg['target']['num_layers']} LM layers of width {cfg['target']['hidden_size']} (head dim 32, GQA 4:2),"
        " a 2-block vision tower of width 64 (trained with dense labels of what is under each visual token beside the"
        f" captions, weight {t.get('vision_aux_weight', 0)}"
        + (f"; it started from {t['vision_from']}'s trained tower, as real VLMs start from a pretrained vision"
           " encoder" if t.get("vision_from") else "") + "); byte-level BPE tokenizer of 512 tokens; Qwen2.5-VL processor at"
        " 112x112, 2 fps: one merged visual token per 28x28 px per second (16 per second).",
        f"- Trained for {last['step']} steps ({last['minutes']:.0f} min wall clock) on freshly drawn clips (no clip seen"
        f" twice): a main stage of {t['minutes']:.0f} min (batch {t['batch_size']}, AdamW lr {t['lr']}, cosine over the"
        f" time budget, init std {t['init_range']}), then a long-context extension of {ext['minutes']:.0f} min (own"
        f" cosine from lr {ext['lr']}).",
        "- Main-stage curriculum (phase: until step, clip seconds, objects per clip, share of steps with stretched "
        "positions): " + "; ".join(f"{p['until_step'] if p['until_step'] < 1 << 29 else 'end'}, {p['durations']}, "
                                   f"{p['objects']}, {p['stretch_share']}" for p in t['curriculum']) + ".",
        f"- Long clips: stretched steps give the M-RoPE positions of a clip up to {t['max_stretch']:.0f}x longer (every"
        " s-th second of it; a long world clip is its short clip slowed down). Positions alone do not teach what 100x"
        f" more visual tokens do to attention over the text, so in the extension {ext['long_share']:.0%} of the steps"
        f" train on real clips of {', '.join(str(d) for d in ext['durations'])} s ({ext['durations'][0] * 16:,}-"
        f"{ext['durations'][-1] * 16:,} visual tokens, batch {ext['batch_size']}, positions stretched up to"
        f" {ext['max_stretch']:.0f}x on {ext['stretch_share']:.0%} of them).",
        *_long_stage(t.get("long") or {}, work / "target" / "long_log.jsonl"),
        "",
        "Held-out teacher-forced word accuracy, measured when this card was written (32 unseen 16 s scenes: real"
        " video, stretched positions, blank video; and 4 unseen 256 s scenes, 4,096 visual tokens). A word counts"
        " as right when all its tokens are" + (" (circle and cross share their first token):" if world == "easy" else ":"),
        "",
    ]
    acc = target_accuracy(models / "target", world)
    lines += ["| word kind | " + " | ".join(k for k in acc["acc"]) + " |", "|---|" + "---|" * len(acc["acc"])]
    labels = {"acc": "real video", "acc_stretch100": "positions stretched 100x", "acc_long": "real 256 s clips",
              "acc_blank": "blank video"}
    for name, label in labels.items():
        lines.append(f"| {label} | " + " | ".join(f"{v:.3f}" for v in acc[name].values()) + " |")
    if "vision" in last:
        lines += ["", "The training-only vision heads read off the held-out clips' merged visual tokens (what the world "
                  "drew under each token, `sparrow_world/demo/vision_aux.py`): " +
                  ", ".join(f"{k} {v:.2f}" for k, v in last["vision"].items()) + "."]
    lines += ["", STRUCT_TEXT[world], "",
              "## Drafts", f"- Trained by the project's pipeline on a capture of {build.get('capture')} "
              f"({', '.join(f'{n} clips of {s} s' for s, n in cfg['draft_clips'].items())}); the target wrote every caption.",
              f"- Sparrow: IVSB (visual states on {1 - cfg['visual_drop']:.0%} of the samples) + MTP "
              f"({cfg['mtp_steps']} extra stages), text window {cfg['window_tokens']} + "
              f"{cfg['anchor_tokens']} anchors, {cfg['draft_steps']} steps, lr {cfg['draft_lr']}; built and "
              f"validated at K={cfg['speculative_tokens']}. Recommended depth K={_recommended_depth(models)} (its "
              f"config.json default; {DEPTH_TEXT[world]}).",
              "- EAGLE-style baseline: same data and steps, reads every position (visual ones too), served by vLLM's `eagle`.",
              "- EAGLE-3 baseline: same data and steps, fuses the target's auxiliary states of every position (vLLM's"
              " default layers), training-time test over its own outputs, served by vLLM's `eagle3`.",
              f"- Replayed acceptance on the {cfg['holdout']} held-out captured clips: Sparrow "
              f"{build['sparrow_heldout_replay']['mean_acceptance_length']:.2f}, EAGLE baseline "
              f"{build['eagle_heldout_replay']['mean_acceptance_length']:.2f}, EAGLE-3 baseline "
              f"{build['eagle3_heldout_replay']['mean_acceptance_length']:.2f}.",
              "- Build times (s): " + ", ".join(f"{k} {v:.0f}" for k, v in build["seconds"].items()) + "."]
    if bench is not None and (bench / "results.json").exists():
        env = json.loads((bench / "results.json").read_text())["environment"]
        lines += ["", "## Through vLLM, per visual length (`sparrow bench`)",
                  f"Measured {env['date']} on {env['gpu'] or 'CPU only (%s cores)' % env['cpu_count']}, vLLM "
                  f"{env['vllm']}, on held-out scenes: the table is published once, in "
                  f"`benchmarks/results/{PUBLISHED[world]}.md` (summary in the repository's README)."]
    path = models / "README.md"
    atomic_write_text(path, "\n".join(lines) + "\n")
    return path
