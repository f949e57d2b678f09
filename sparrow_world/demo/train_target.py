"""Train the demo target from scratch on the CPU: a small Qwen2.5-VL that captions world clips.

    sparrow demo build   (stage 1 of it; see build.py)

Clips are drawn on the fly (a new scene each sample, so no memorisation). Three stages, as LLMs
are trained: a main stage on short clips (2-16 s, 32-256 visual tokens) with stretched positions
on a share of the batches (see `target_data.py`), then a long-context extension stage that mixes
in real long clips (1k-4k visual tokens, stretched too), because positions alone do not teach a
model what 100x more visual tokens do to its attention over the text; then (`LongStage`, the
hard world's build) batch-1 steps on real clips of up to 1,536 s (24,576 visual tokens), the
lengths the benchmark measures at (issue 47). Progress prints every few steps; checkpoints make
every stage resumable (`--resume`), the long stage's to the same weights as an uninterrupted run;
held-out teacher-forced accuracy is logged per word category, with the real video and with a
blank one, and the long stage also scores greedy captions of long clips by meaning.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from vllm_sparrow.durable import append_jsonl, atomic_torch_save
from ..world import WorldConfig
from .target_data import WorldBatches, blank_like, word_hits
from .vision_aux import VisionHeads, VisualTokenTap

EVAL_SEED0 = 10_000_000  # held-out scenes; training seeds stay below this
LONG_EVAL_SECONDS, LONG_EVAL_SCENES = 256, 4  # held-out long clips (4k visual tokens) in every eval


@dataclass(frozen=True)
class Phase:
    """Training clips until `until_step`: clip lengths (s), objects per clip, share of steps with
    stretched positions."""

    until_step: int
    durations: tuple[int, ...]
    objects: tuple[int, int]
    stretch_share: float


# The curriculum. Short clips with one or two objects first: 32-64 visual tokens make the
# "find the red tokens, read their shape" lookup easy to discover and a step ~4x cheaper; then
# more objects and longer clips; stretched positions (long-clip M-RoPE offsets) only once the
# lookup works, since random offsets slow its discovery down.
CURRICULUM = (
    Phase(400, (2, 4), (1, 2), 0.0),
    Phase(1000, (4, 8), (2, 6), 0.3),
    Phase(1 << 30, (8, 12, 16), (7, 12), 0.6),
)


@dataclass(frozen=True)
class Extension:
    """The long-context extension stage, run after the main stage's budget: its own warmup and
    cosine schedule; a `long_share` of its steps train on real long clips (smaller batches, their
    own position stretch), the rest continue the main stage's last phase."""

    minutes: float = 25.0
    lr: float = 1e-3
    warmup: int = 20
    long_share: float = 0.5
    durations: tuple[int, ...] = (64, 128, 256)  # 1k, 2k, 4k visual tokens
    batch_size: int = 2
    stretch_share: float = 0.5  # 256 s x 8 covers the longest benchmark clip's positions
    max_stretch: float = 8.0


@dataclass(frozen=True)
class LongStage:
    """The long-clip stage (issue 47), after the extension: batch-1 steps on real clips as long
    as the benchmark's (the extension's reach 4,096 visual tokens and 24,960 only by stretched
    positions), from a fresh AdamW with its own warmup and cosine over `steps`.

    Its budget is steps, not minutes: one step costs under 1 s to 46 s by its clip's length
    (attention is quadratic in it), so a time budget would train another number of long steps,
    and another model, whenever the machine is busier; a step budget gives the same model on any
    machine and under any load, and a kill resumes to the same weights.

    The vision tower is frozen: it reads each 1 s temporal patch on its own (attention inside a
    patch only), so a long clip shows it nothing a short one does not, and freezing it spares its
    backward over 98k patches and the training-only vision heads, which a shipped target lacks:
    the stage starts alike from the stage-1 checkpoint or from a target folder's weights.
    Gradient checkpointing is not used: measured on 1,536 s steps at one thread it took the peak
    memory from 3.6 to 3.4-3.5 GB (the clip's 0.46 GB of pixels and the tower's forward over them
    set most of it; the flash-style attention keeps no [L, L] scores) and the step from 41-43 s
    to 58-67 s. Measured step times: docs/demo-world.md."""

    steps: int = 0  # 0: no long stage (the easy world; what a checkpoint that predates the stage had)
    lr: float = 3e-4
    warmup: int = 20
    # 6k to 25k visual tokens, drawn evenly: the benchmark's dip starts past ~12k (issue 47)
    durations: tuple[int, ...] = (384, 768, 1024, 1280, 1536)
    # steps that replay the extension's batches instead (its 64-256 s clips or the main stage's
    # short ones, stretched as there), so the stage does not forget them
    replay_share: float = 0.2
    stretch_share: float = 0.25
    max_stretch: float = 1.05  # 1,536 s x 1.05 covers the longest benchmark clip's positions (1,560 s)
    # held-out clips of these lengths (the same scenes at each), teacher-forced and captioned
    # greedily, scored by meaning; not part of the recipe (evals change no weights), nor are
    # eval_every and save_every
    eval_seconds: tuple[int, ...] = (256, 1088, 1536)
    eval_scenes: int = 4  # as many as acc_long's (LONG_EVAL_SCENES); an eval takes ~2 min at one thread
    eval_every: int = 100
    save_every: int = 5  # a step is up to ~50 s: a kill loses at most a few minutes


@dataclass
class TargetTrainConfig:
    world: str = "easy"  # how captions are said: sparrow_world/world/languages.py
    # a trained target whose vision tower (same width) this one starts from, as real VLMs start
    # from a pretrained vision encoder; None trains the tower from scratch too
    vision_from: str | None = None
    # train the tokenizer's BPE on the world's captions too (languages.Language.tokenizer_corpus),
    # so its words are single tokens as common words are in a real tokenizer
    world_tokenizer: bool = False
    hidden_size: int = 128
    num_layers: int = 3
    init_range: float = 0.02  # the test models' 0.2 saturates a model that has to learn (measured:
    # with 0.2 the video lookup was not learned in 1000 steps)
    lr: float = 2e-3
    weight_decay: float = 0.01
    warmup: int = 100
    batch_size: int = 8
    curriculum: tuple[Phase, ...] = CURRICULUM
    # weight of the dense vision loss (vision_aux.py) beside the caption loss: without it the
    # tower learned colours only and captions got shapes, sizes and motions at blank-video rates
    vision_aux_weight: float = 0.5
    max_stretch: float = 200.0  # 8 s x 200 = 1600 s, past the longest benchmark clip
    minutes: float = 30.0  # main stage's wall-clock budget; its cosine schedule runs over it (time,
    # not steps: a 2-core CPU fits ~2.3k steps; a faster machine more)
    extension: Extension = field(default_factory=Extension)
    long: LongStage = field(default_factory=LongStage)
    max_steps: int = 1_000_000
    eval_every: int = 200
    eval_scenes: int = 32
    save_every: int = 50
    seed: int = 0
    threads: int = 2

    def phase(self, step: int) -> Phase:
        return next(p for p in self.curriculum if step < p.until_step)

    @property
    def total_seconds(self) -> float:
        """The main stage's and the extension's budget (stage 1); the long stage counts steps."""
        return 60 * (self.minutes + self.extension.minutes)


def build_untrained(out: Path, cfg: TargetTrainConfig) -> Path:
    """The target's folder (config, tokenizer, processor, chat template), random weights."""
    from ..tiny_targets import build_tiny_target
    from ..world.languages import language

    corpus = ""
    if cfg.world_tokenizer:
        words = language(cfg.world)
        if words.tokenizer_corpus is None:
            raise ValueError(f"the {cfg.world} world has no tokenizer corpus: train with world_tokenizer=False")
        corpus = words.tokenizer_corpus()
    return build_tiny_target("qwen2_5_vl", out, seed=cfg.seed, hidden_size=cfg.hidden_size,
                             num_layers=cfg.num_layers, init_range=cfg.init_range, corpus=corpus)


def train_target(out: str | Path, cfg: TargetTrainConfig, resume: bool = False,
                 state_dir: str | Path | None = None, start_from: str | Path | None = None) -> Path:
    """Train into `out` (the servable model folder); checkpoints and logs go to `state_dir`
    (default: `out`). With `resume`, a finished run is only saved to `out` again.

    The long stage (`cfg.long.steps` > 0) starts from the finished stage-1 checkpoint (main stage
    and extension) in `state_dir`; with `start_from`, a trained target folder, it starts from
    that folder's weights instead whenever there is no finished stage-1 checkpoint of this recipe
    to resume (a fresh checkout ships the target those stages made, not their checkpoint)."""
    out = Path(out)
    state_dir = Path(state_dir or out)
    state_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(cfg.threads)
    folder = None
    if cfg.long.steps and start_from is not None and not _stage1_finished(state_dir, cfg, resume):
        folder = Path(start_from)
        print(f"no finished stage-1 checkpoint in {state_dir}: the long stage's start is {folder}'s weights",
              flush=True)
    else:
        _train_stage1(out, cfg, resume, state_dir)
    if cfg.long.steps:
        _train_long(out, cfg, state_dir, folder, resume)
    return out


def _stage1_finished(state_dir: Path, cfg: TargetTrainConfig, resume: bool) -> bool:
    ckpt = state_dir / "train_state.pt"
    if not (resume and ckpt.exists()):
        return False
    saved = torch.load(ckpt, weights_only=False)
    return not _recipe_changes(saved["config"], cfg) and saved["state"]["elapsed"] >= cfg.total_seconds


def _train_stage1(out: Path, cfg: TargetTrainConfig, resume: bool, state_dir: Path) -> None:
    """The main stage and the extension, on wall-clock budgets; the finished weights go to `out`."""
    from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

    ckpt = state_dir / "train_state.pt"
    saved = torch.load(ckpt, weights_only=False) if resume and ckpt.exists() else None
    changed = _recipe_changes(saved["config"], cfg) if saved is not None else []
    if changed:
        print(f"the checkpoint in {state_dir} was trained with another recipe ({', '.join(changed)}): "
              f"training the target again from scratch", flush=True)
        (state_dir / "train_log.jsonl").unlink(missing_ok=True)
        saved = None
    if saved is None:
        if resume:
            print(f"no checkpoint to resume in {state_dir}; starting fresh", flush=True)
        build_untrained(out, cfg)
    data = _world_batches(AutoTokenizer.from_pretrained(out), cfg)
    torch.manual_seed(cfg.seed)
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(out, dtype=torch.float32)
    if saved is None and cfg.vision_from:
        from ..paths import in_checkout

        _load_vision_tower(model, Path(in_checkout(cfg.vision_from)))
    heads = VisionHeads(model.config.vision_config.out_hidden_size)  # training only; not shipped
    opt = _optimizer(model, heads, cfg)
    state = dict(step=0, elapsed=0.0, rng=np.random.default_rng(cfg.seed + 1).bit_generator.state)
    if saved is not None:
        model.load_state_dict(saved["model"])
        heads.load_state_dict(saved["heads"])
        opt.load_state_dict(saved["opt"])
        state = saved["state"]
        print(f"resumed at step {state['step']} ({state['elapsed'] / 60:.1f} min done)", flush=True)
        if state["elapsed"] >= cfg.total_seconds:  # finished: no more steps or evals, just the weights
            model.save_pretrained(out, safe_serialization=True)
            return
    rng = np.random.default_rng()
    rng.bit_generator.state = state["rng"]
    held_out = [data.sample(EVAL_SEED0 + i, WorldConfig(duration_s=16)) for i in range(cfg.eval_scenes)]
    held_out_long = [data.sample(EVAL_SEED0 + i, WorldConfig(duration_s=LONG_EVAL_SECONDS))
                     for i in range(LONG_EVAL_SCENES)]
    main_s, budget = cfg.minutes * 60, cfg.total_seconds
    tap = VisualTokenTap(model)
    model.train()
    t_start = time.time() - state["elapsed"]
    ema = cema = None
    while state["step"] < cfg.max_steps:
        step, elapsed = state["step"], time.time() - t_start
        extending = elapsed >= main_s
        entering = extending and state.get("ext_step0") is None
        if entering:
            state["ext_step0"] = step
            print(f"main stage done at step {step}; long-context extension for {cfg.extension.minutes:.0f} min",
                  flush=True)
        if step % cfg.eval_every == 0 or elapsed >= budget or entering:
            rec = dict(step=step, minutes=round(elapsed / 60, 2), train_loss_ema=ema,
                       stage="extension" if extending else "main",
                       **evaluate(model, data, held_out, cfg.batch_size, held_out_long, heads))
            append_jsonl(state_dir / "train_log.jsonl", rec)
            print(_eval_line(rec), flush=True)
            if elapsed >= budget:
                break
        lr, long = _schedule(cfg, step, elapsed, state.get("ext_step0"), rng)
        loss, content = _train_step(model, heads, tap, opt, data, rng, cfg, lr=lr, step=step, long=long)
        ema = loss if ema is None else 0.98 * ema + 0.02 * loss
        cema = content if cema is None else 0.95 * cema + 0.05 * content
        state.update(step=step + 1, elapsed=time.time() - t_start, rng=rng.bit_generator.state)
        if (step + 1) % 10 == 0:
            print(f"step {step + 1}  loss {loss:.3f}  ema {ema:.3f}  shape/size/motion acc ema {cema:.3f}  "
                  f"{state['elapsed'] / 60:.1f}/{budget / 60:.0f} min", flush=True)
        if (step + 1) % cfg.save_every == 0:
            _save(model, heads, opt, state, cfg, state_dir)
    tap.remove()
    _save(model, heads, opt, state, cfg, state_dir)
    model.save_pretrained(out, safe_serialization=True)


def _world_batches(tok, cfg: TargetTrainConfig) -> WorldBatches:
    from ..tiny_targets import make_prompt
    from ..world.languages import language

    words = language(cfg.world)
    return WorldBatches(tok, make_prompt("qwen2_5_vl", tok, words.prompt, media="video"), words)


def _load_vision_tower(model, source: Path) -> None:
    """Copy the vision tower (patch embedding, blocks and merger) of the target in `source`."""
    from safetensors.torch import load_file

    theirs = load_file(source / "model.safetensors")  # saved names: "visual.*"; in memory "model.visual.*"
    ours = {k: v for k, v in model.state_dict().items() if "visual." in k}
    tower = {k: theirs[k[k.index("visual."):]] for k in ours if k[k.index("visual."):] in theirs}
    missing = [k for k in ours if k not in tower]
    wrong = [k for k, v in tower.items() if ours[k].shape != v.shape]
    if missing or wrong:
        raise ValueError(f"{source} has no vision tower of this target's shape (missing {missing[:3]}, "
                         f"other shapes {wrong[:3]}): build it with the same hidden size and vision config")
    model.load_state_dict(tower, strict=False)
    print(f"vision tower: {len(tower)} tensors from {source}", flush=True)


def _schedule(cfg: TargetTrainConfig, step: int, elapsed: float, ext_step0: int | None, rng) -> tuple[float, bool]:
    """This step's learning rate, and whether it trains on long clips (extension stage only, which
    began at step `ext_step0`)."""
    main_s = cfg.minutes * 60
    if ext_step0 is None:
        return _cosine(cfg.lr, step, cfg.warmup, elapsed / main_s), False
    ext = cfg.extension
    lr = _cosine(ext.lr, step - ext_step0, ext.warmup, (elapsed - main_s) / (60 * ext.minutes))
    return lr, bool(rng.random() < ext.long_share)


def _train_step(model, heads: VisionHeads, tap: VisualTokenTap, opt, data: WorldBatches, rng,
                cfg: TargetTrainConfig, lr: float, step: int, long: bool = False):
    samples, stretch = _draw(data, rng, cfg, cfg.phase(step), long)
    kw, labels, P = data.batch(samples, stretch)
    for group in opt.param_groups:
        group["lr"] = lr
    logits = caption_logits(model, kw, P)  # [B, L - P, V]
    loss = caption_loss(logits, labels, P)
    seen = torch.from_numpy(np.concatenate([s.labels for s in samples]))  # [visual tokens, 4]
    total = loss + cfg.vision_aux_weight * heads.loss(tap.take(), seen)
    opt.zero_grad(set_to_none=True)
    total.backward()
    torch.nn.utils.clip_grad_norm_([*model.parameters(), *heads.parameters()], 1.0)
    opt.step()
    return float(loss.detach()), _content_accuracy(logits.detach(), samples)


def _draw(data: WorldBatches, rng, cfg: TargetTrainConfig, phase: Phase, long: bool):
    """A main-stage batch of `phase` (or with `long`, an extension batch of its long clips) and
    its position stretch: -> (samples, stretch)."""
    ext = cfg.extension
    durations, batch_size = (ext.durations, ext.batch_size) if long else (phase.durations, cfg.batch_size)
    stretch_share, max_stretch = (ext.stretch_share, ext.max_stretch) if long else (phase.stretch_share,
                                                                                    cfg.max_stretch)
    duration = int(rng.choice(durations))
    stretch = 1.0
    if rng.random() < stretch_share:
        stretch = float(math.exp(rng.uniform(0.0, math.log(max_stretch))))
    seeds = rng.integers(0, EVAL_SEED0, batch_size)
    world = WorldConfig(duration_s=duration, min_objects=phase.objects[0], max_objects=phase.objects[1])
    return [data.sample(int(s), world) for s in seeds], stretch


def caption_logits(model, kw: dict, P: int):
    """The LM head on caption positions only (the loss covers nothing else): logits [B, L - P, V],
    row j predicting caption token j (sequence position P + j). The prompt and the video are most
    of a long clip's L, so [B, L, V] would be computed and kept for backward for nothing."""
    L = kw["input_ids"].shape[1]
    return model(**kw, logits_to_keep=L - P + 1).logits[:, :-1]  # positions P - 1 .. L - 2


def caption_loss(logits, labels, P: int):
    """logits [B, L - P, V] from `caption_logits`, labels [B, L] (-100 off the caption)."""
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels[:, P:].flatten(),
                                             ignore_index=-100)


def _content_accuracy(logits, samples) -> float:
    """Share of shape/size/motion words predicted right in this batch (the video-only words)."""
    pred = logits.argmax(-1)  # [B, L - P]
    hits = [ok for b, s in enumerate(samples) for cat, ok in _word_hits(pred[b], s)
            if cat in ("shape", "size", "motion")]
    return sum(hits) / max(1, len(hits))


def _word_hits(pred, sample) -> list[tuple[str, bool]]:
    """pred [>= caption length] argmax tokens, pred[j] for caption token j -> (category, right) per word."""
    correct = [int(pred[j]) == t for j, t in enumerate(sample.caption_ids)]
    return word_hits(correct, sample.categories)


@torch.no_grad()
def evaluate(model, data: WorldBatches, samples, batch_size: int, long_samples=(),
             heads: VisionHeads | None = None) -> dict:
    """Teacher-forced accuracy of caption words per category (a word is right when all its tokens
    are; target_data.token_categories): real video, blank video, stretched positions, and real
    long clips (`long_samples`, one at a time); with `heads`, also what the vision heads read off
    the real clips' visual tokens ("vision")."""
    was_training = model.training
    model.eval()
    result = {}
    if heads is not None:
        result["vision"] = _vision_accuracy(model, heads, data, samples, batch_size)
    blank = [blank_like(s) for s in samples]
    groups = [("acc", samples, 1.0, batch_size), ("acc_stretch100", samples, 100.0, batch_size),
              ("acc_blank", blank, 1.0, batch_size)]
    if long_samples:
        groups.append(("acc_long", list(long_samples), 1.0, 1))
    for name, group, stretch, per_batch in groups:
        hits = []
        for i in range(0, len(group), per_batch):
            chunk = group[i:i + per_batch]
            kw, labels, P = data.batch(chunk, stretch)
            pred = caption_logits(model, kw, P).argmax(-1)  # [B, L - P]
            hits += [hit for b, s in enumerate(chunk) for hit in _word_hits(pred[b], s)]
        result[name] = _per_category(hits, data.language.categories)
    if was_training:
        model.train()
    return result


def _per_category(hits: list[tuple[str, bool]], categories) -> dict:
    """(category, right) per word -> share right per category, and over all words ("all")."""
    acc = {c: round(sum(ok for k, ok in hits if k == c) / max(1, sum(k == c for k, _ in hits)), 4)
           for c in categories}
    acc["all"] = round(sum(ok for _, ok in hits) / max(1, len(hits)), 4)
    return acc


GREEDY_TOKENS = 320  # the longest greedy caption of the long eval: the build's caption_tokens, the bench's


@torch.no_grad()
def evaluate_long(model, data: WorldBatches, seconds: tuple[int, ...], scenes: int) -> dict:
    """Held-out scenes EVAL_SEED0 + i (i < scenes), the same at every length in `seconds`, one clip
    at a time (a 1,536 s clip's pixels are 0.46 GB: drawn when needed, not kept): per length, the
    teacher-forced accuracy per word category ("acc", as `evaluate`) and the greedy captions scored
    by meaning ("facts": hard_caption.facts against the scene's, as the benchmark scores them; the
    easy world, one right caption, has none). One forward serves both: greedy decoding continues
    from its KV cache cut back to the prompt."""
    from ..bench.run import caption_accuracy
    from ..world import sample_scene

    was_training = model.training
    model.eval()
    words, result = data.language, {}
    for length in seconds:
        hits, captions, truths, facts = [], [], [], []
        for i in range(scenes):
            world = WorldConfig(duration_s=length)
            sample = data.sample(EVAL_SEED0 + i, world)
            pred, caption = _teacher_forced_then_greedy(model, data, sample)
            hits += _word_hits(pred, sample)
            scene = sample_scene(EVAL_SEED0 + i, world)
            captions.append(caption)
            truths.append(words.caption(scene))
            facts.append(frozenset(words.scene_facts(scene)) if words.scene_facts else None)
        row = {"acc": _per_category(hits, words.categories),
               "caption_tokens": round(sum(map(len, captions)) / len(captions), 1)}
        if words.scene_facts is not None:
            scored = caption_accuracy(data.tok, captions, truths, facts)
            row["facts"] = {k: round(v, 4) for k, v in scored.items() if v is not None}
        result[f"{length}s"] = row
    if was_training:
        model.train()
    return result


def _teacher_forced_then_greedy(model, data: WorldBatches, sample) -> tuple:
    """-> (teacher-forced argmax per caption token [caption length], greedy caption token ids)."""
    kw, _, P = data.batch([sample])
    L = kw["input_ids"].shape[1]
    out = model(**kw, use_cache=True, logits_to_keep=L - P + 1)
    pred = out.logits[0, :-1].argmax(-1)  # [L - P]
    cache = out.past_key_values
    cache.crop(-(L - P))  # back to the prompt: the greedy caption continues from there
    position = kw["position_ids"][:, :, P - 1:P] + 1  # [3, 1, 1]: text after the prompt counts on by one
    token, caption = out.logits[:, 0].argmax(-1), []  # [1]
    for i in range(GREEDY_TOKENS):
        caption.append(int(token))
        if caption[-1] == data.end_id or i == GREEDY_TOKENS - 1:
            break
        step = model(input_ids=token[:, None], past_key_values=cache, position_ids=position + i, use_cache=True)
        token = step.logits[:, -1].argmax(-1)
    return pred, caption


def _vision_accuracy(model, heads: VisionHeads, data: WorldBatches, samples, batch_size: int) -> dict:
    tap = VisualTokenTap(model)
    try:
        tokens, labels = [], []
        for i in range(0, len(samples), batch_size):
            chunk = samples[i:i + batch_size]
            model(**data.batch(chunk)[0])
            tokens.append(tap.take())
            labels += [torch.from_numpy(s.labels) for s in chunk]
        return heads.accuracy(torch.cat(tokens), torch.cat(labels))
    finally:
        tap.remove()


def _eval_line(rec: dict) -> str:
    a, s, b = rec["acc"], rec["acc_stretch100"], rec["acc_blank"]
    n = rec.get("acc_long", {c: float("nan") for c in a})
    cats = " ".join(f"{c} {a[c]:.2f}/{s[c]:.2f}/{n[c]:.2f}/{b[c]:.2f}" for c in a if c != "all")
    seen = " ".join(f"{k} {v:.2f}" for k, v in rec.get("vision", {}).items())
    return (f"[eval step {rec['step']} {rec['minutes']} min] all {a['all']:.3f} (stretched {s['all']:.3f}, "
            f"{LONG_EVAL_SECONDS} s clips {n['all']:.3f}, blank {b['all']:.3f}) | real/stretched/long/blank: {cats}"
            f" | vision tokens: {seen}")


def _long_eval_line(rec: dict) -> str:
    """One line of a long-stage eval: per length, teacher-forced accuracy (all words) and the
    greedy captions' fact accuracy."""
    parts = []
    for length, row in rec["long"].items():
        facts = row.get("facts", {}).get("caption_fact_accuracy")
        parts.append(f"{length}: words {row['acc']['all']:.3f}" + (f" facts {facts:.3f}" if facts is not None else ""))
    return (f"[long eval step {rec['step']} {rec['minutes']} min] 16 s: all {rec['acc']['all']:.3f} (stretched "
            f"{rec['acc_stretch100']['all']:.3f}, blank {rec['acc_blank']['all']:.3f}) | " + " | ".join(parts))


def _recipe_changes(saved: dict, cfg: TargetTrainConfig) -> list[str]:
    """Knobs whose value differs from the checkpoint's, except those that do not change the
    weights (threads, how often to eval and save)."""
    now, defaults = asdict(cfg), asdict(TargetTrainConfig())
    # a knob the checkpoint predates was at its default then; the long stage's knobs change
    # nothing that stage 1 trains (the long stage checks them itself: _long_recipe_changes)
    return sorted(k for k in now if k not in ("threads", "eval_every", "save_every", "long")
                  and _normal(saved.get(k, defaults[k])) != _normal(now[k]))


def _normal(value) -> str:
    """A knob's value as text, tuples and lists alike, as a checkpoint may store either."""
    return json.dumps(value, sort_keys=True, default=str)


def _optimizer(model, heads: VisionHeads | None, cfg: TargetTrainConfig):
    """AdamW over the trainable weights (the long stage freezes the vision tower), decay on matrices."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decay = [p for n, p in named if p.ndim >= 2 and "embed" not in n] + list(heads.parameters() if heads else [])
    rest = [p for n, p in named if not (p.ndim >= 2 and "embed" not in n)]
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": rest, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.98))


def _cosine(peak: float, step: int, warmup: int, frac: float) -> float:
    """Linear warmup over `warmup` steps, then cosine to 5% of `peak` at `frac` = 1."""
    warm = min(1.0, (step + 1) / warmup)
    return peak * warm * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def _save(model, heads: VisionHeads, opt, state, cfg: TargetTrainConfig, out: Path) -> None:
    atomic_torch_save(out / "train_state.pt", dict(  # a kill mid-save keeps the last checkpoint
        model=model.state_dict(), heads=heads.state_dict(), opt=opt.state_dict(), state=state, config=asdict(cfg)))


# ---------------------------------------------------------------------------- the long stage


def _train_long(out: Path, cfg: TargetTrainConfig, state_dir: Path, folder: Path | None, resume: bool) -> None:
    """The long stage (`LongStage`) from the finished stage-1 checkpoint in `state_dir`, or with
    `folder` from that target folder's weights; its checkpoint (long_state.pt, every `save_every`
    steps and at the end) and eval log (long_log.jsonl) go to `state_dir`, the weights to `out`."""
    from transformers import AutoConfig, AutoTokenizer, Qwen2_5_VLForConditionalGeneration

    long, ckpt, log = cfg.long, state_dir / "long_state.pt", state_dir / "long_log.jsonl"
    source = "stage-1 checkpoint" if folder is None else str(folder)
    saved = torch.load(ckpt, weights_only=False) if resume and ckpt.exists() else None
    changed = _long_recipe_changes(saved, cfg, source) if saved is not None else []
    if changed:
        print(f"the long stage in {state_dir} was trained with another recipe ({', '.join(changed)}): "
              f"training it again from its start", flush=True)
        saved = None
    if saved is None:
        log.unlink(missing_ok=True)
    home = out if folder is None else folder  # config, tokenizer and processor of the model trained
    data = _world_batches(AutoTokenizer.from_pretrained(home), cfg)
    # weights from the checkpoints: home's may be a write a kill tore (home is often `out`)
    model = Qwen2_5_VLForConditionalGeneration._from_config(AutoConfig.from_pretrained(home), dtype=torch.float32)
    model.model.visual.requires_grad_(False)  # frozen: LongStage says why
    if saved is None:
        weights, start = _long_start(state_dir, folder)
        model.load_state_dict(weights)
        state = dict(step=0, seconds=0.0, ema=None, start=start,
                     rng=np.random.default_rng(cfg.seed + 2).bit_generator.state)
    else:
        model.load_state_dict(saved["model"])
        state = saved["state"]
        print(f"long stage resumed at step {state['step']}/{long.steps} ({state['seconds'] / 60:.1f} min done)",
              flush=True)
    opt = _optimizer(model, None, cfg)
    if saved is not None:
        opt.load_state_dict(saved["opt"])
    if state["step"] < long.steps:  # a finished stage saved its checkpoint after its last eval
        _forget_log_rows(log, state["step"])  # an eval logged after the checkpoint is redone
        _long_loop(model, opt, data, cfg, state, state_dir)
    if folder is not None and folder.resolve() != out.resolve():
        _copy_model_files(folder, out)
    _save_weights(model, out)


def _long_loop(model, opt, data: WorldBatches, cfg: TargetTrainConfig, state: dict, state_dir: Path) -> None:
    """Steps until `long.steps`, an eval every `eval_every` steps and at the end; the last
    checkpoint is written after the last eval, so a finished stage has its whole log."""
    long = cfg.long
    rng = np.random.default_rng()
    rng.bit_generator.state = state["rng"]
    held_out = [data.sample(EVAL_SEED0 + i, WorldConfig(duration_s=16)) for i in range(cfg.eval_scenes)]
    t_start = time.time() - state["seconds"]
    model.train()
    while True:
        step = state["step"]
        if step % long.eval_every == 0 or step == long.steps:
            rec = dict(step=step, minutes=round((time.time() - t_start) / 60, 2), train_loss_ema=state["ema"],
                       stage="long", **evaluate(model, data, held_out, cfg.batch_size),
                       long=evaluate_long(model, data, long.eval_seconds, long.eval_scenes))
            append_jsonl(state_dir / "long_log.jsonl", rec)
            print(_long_eval_line(rec), flush=True)
        if step == long.steps:
            break
        lr = _cosine(long.lr, step, long.warmup, step / long.steps)
        samples, stretch = _long_draw(data, rng, cfg)
        loss = _long_step(model, opt, data, samples, stretch, lr)
        ema = loss if state["ema"] is None else 0.95 * state["ema"] + 0.05 * loss
        state.update(step=step + 1, seconds=time.time() - t_start, ema=ema, rng=rng.bit_generator.state)
        print(f"long step {step + 1}/{long.steps}  {samples[0].grid[0]} s x{len(samples)}  loss {loss:.3f}  "
              f"ema {ema:.3f}  lr {lr:.2e}  {state['seconds'] / 60:.1f} min", flush=True)
        if (step + 1) % long.save_every == 0 and step + 1 < long.steps:
            _save_long(model, opt, state, cfg, state_dir)
    state["seconds"] = time.time() - t_start
    _save_long(model, opt, state, cfg, state_dir)


def _long_draw(data: WorldBatches, rng, cfg: TargetTrainConfig):
    """A long-stage batch: one clip of `long.durations` (a light position stretch on a share), or
    on `replay_share` of the steps an extension batch (its long clips or the main stage's last
    phase, as the extension mixes them): -> (samples, stretch)."""
    long, last = cfg.long, cfg.curriculum[-1]
    if rng.random() < long.replay_share:
        return _draw(data, rng, cfg, last, bool(rng.random() < cfg.extension.long_share))
    duration = int(rng.choice(long.durations))
    stretch = 1.0
    if rng.random() < long.stretch_share:
        stretch = float(math.exp(rng.uniform(0.0, math.log(long.max_stretch))))
    world = WorldConfig(duration_s=duration, min_objects=last.objects[0], max_objects=last.objects[1])
    return [data.sample(int(rng.integers(0, EVAL_SEED0)), world)], stretch


def _long_step(model, opt, data: WorldBatches, samples, stretch: float, lr: float) -> float:
    kw, labels, P = data.batch(samples, stretch)
    for group in opt.param_groups:
        group["lr"] = lr
    loss = caption_loss(caption_logits(model, kw, P), labels, P)  # logits [B, L - P, V]
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
    opt.step()
    return float(loss.detach())


def _long_start(state_dir: Path, folder: Path | None) -> tuple[dict, dict]:
    """The long stage's starting weights and what they are: the finished stage-1 checkpoint's, or
    `folder`'s, snapshotted into long_start.pt the first time, since `folder` is often the
    stage's own output (models/world-hard/target): a restart after a recipe change must begin
    from the weights the stage first began from, not from what it made of them."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    if folder is None:
        saved = torch.load(state_dir / "train_state.pt", weights_only=False)
        return saved["model"], dict(source="stage-1 checkpoint", path=str(state_dir / "train_state.pt"),
                                    stage1_step=saved["state"]["step"])
    snapshot = state_dir / "long_start.pt"
    kept = torch.load(snapshot, weights_only=False) if snapshot.exists() else None
    if kept is not None and kept["start"]["source"] == str(folder):
        print(f"long stage starts from the weights {folder} had when it first started ({snapshot})", flush=True)
        return kept["model"], kept["start"]
    weights = Qwen2_5_VLForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).state_dict()
    start = dict(source=str(folder), sha256=_sha256(folder / "model.safetensors"))
    atomic_torch_save(snapshot, dict(model=weights, start=start))
    return weights, start


def _sha256(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _save_weights(model, out: Path) -> None:
    """The servable weights into `out`, each file renamed into place whole: `out` may be the
    shipped target, which a kill during the write must not leave torn."""
    import os
    import tempfile

    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        for path in Path(tmp).iterdir():
            os.replace(path, out / path.name)


def _copy_model_files(folder: Path, out: Path) -> None:
    """`folder`'s config, tokenizer, processor and chat template into `out` (the weights follow)."""
    import shutil

    out.mkdir(parents=True, exist_ok=True)
    for path in folder.iterdir():
        if path.is_file() and path.suffix != ".safetensors":
            shutil.copy2(path, out / path.name)


def _long_recipe_changes(saved: dict, cfg: TargetTrainConfig, source: str) -> list[str]:
    """Why a long-stage checkpoint cannot be resumed: stage-1 knobs that differ (other starting
    weights, other replayed batches), long-stage knobs that change weights, another start."""
    now, then = asdict(cfg.long), saved["config"].get("long", {})
    neutral = ("eval_seconds", "eval_scenes", "eval_every", "save_every")
    changed = _recipe_changes(saved["config"], cfg)
    changed += [f"long.{k}" for k in now if k not in neutral and _normal(then.get(k)) != _normal(now[k])]
    if saved["state"]["start"]["source"] != source:
        changed.append(f"start ({saved['state']['start']['source']} there, {source} now)")
    return changed


def _forget_log_rows(log: Path, step: int) -> None:
    """Drop the eval rows of steps at or past `step` (written after the checkpoint a kill left)."""
    from vllm_sparrow.durable import atomic_write_text, read_jsonl

    if not log.exists():
        return
    rows = read_jsonl(log)
    kept = [r for r in rows if r["step"] < step]
    if len(kept) != len(rows):
        atomic_write_text(log, "".join(json.dumps(r) + "\n" for r in kept))


def _save_long(model, opt, state: dict, cfg: TargetTrainConfig, out: Path) -> None:
    atomic_torch_save(out / "long_state.pt", dict(  # a kill mid-save keeps the last checkpoint
        model=model.state_dict(), opt=opt.state_dict(), state=state, config=asdict(cfg)))


def stage1_record(state_dir: str | Path) -> dict | None:
    """What the build records of stage 1 (the main stage and the extension, train_log.jsonl in
    `state_dir`), for the model card: its last eval's step, minutes and, when it has them, what
    the vision heads read ("vision"); None when there is no log (a checkout that ships the
    target keeps this record in build.json, not the log)."""
    from vllm_sparrow.durable import read_jsonl

    log = Path(state_dir) / "train_log.jsonl"
    evals = [r for r in read_jsonl(log) if "acc" in r] if log.exists() else []
    if not evals:
        return None
    return {k: evals[-1][k] for k in ("step", "minutes", "vision") if k in evals[-1]}


def long_stage_record(state_dir: str | Path) -> dict | None:
    """What the build records of the long stage in `state_dir`: its start, steps and seconds, and
    its last eval; None when there is none."""
    ckpt = Path(state_dir) / "long_state.pt"
    if not ckpt.exists():
        return None
    from vllm_sparrow.durable import read_jsonl

    state = torch.load(ckpt, weights_only=False)["state"]
    evals = read_jsonl(Path(state_dir) / "long_log.jsonl") if (Path(state_dir) / "long_log.jsonl").exists() else []
    return dict(start=state["start"], steps=state["step"], seconds=round(state["seconds"], 1),
                first_eval=evals[0] if evals else None, last_eval=evals[-1] if evals else None)
