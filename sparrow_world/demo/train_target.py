"""Train the demo target from scratch on the CPU: a small Qwen2.5-VL that captions world clips.

    sparrow demo build   (stage 1 of it; see build.py)

Clips are drawn on the fly (a new scene each sample, so no memorisation). Two stages, as LLMs
are trained: a main stage on short clips (2-16 s, 32-256 visual tokens) with stretched positions
on a share of the batches (see `target_data.py`), then a long-context extension stage that mixes
in real long clips (1k-4k visual tokens, stretched too), because positions alone do not teach a
model what 100x more visual tokens do to its attention over the text. Progress prints every few steps;
a checkpoint every `save_every` steps makes the run resumable (`--resume`); held-out
teacher-forced accuracy is logged per word category, with the real video and with a blank one.
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
                 state_dir: str | Path | None = None) -> Path:
    """Train into `out` (the servable model folder); the checkpoint and log go to `state_dir`
    (default: `out`). With `resume`, a finished run is only saved to `out` again."""
    from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

    from ..tiny_targets import make_prompt
    from ..world.languages import language

    out = Path(out)
    state_dir = Path(state_dir or out)
    state_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(cfg.threads)
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
    tok = AutoTokenizer.from_pretrained(out)
    words = language(cfg.world)
    data = WorldBatches(tok, make_prompt("qwen2_5_vl", tok, words.prompt, media="video"), words)
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
            return out
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
    return out


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
    phase, ext = cfg.phase(step), cfg.extension
    durations, batch_size = (ext.durations, ext.batch_size) if long else (phase.durations, cfg.batch_size)
    stretch_share, max_stretch = (ext.stretch_share, ext.max_stretch) if long else (phase.stretch_share,
                                                                                    cfg.max_stretch)
    duration = int(rng.choice(durations))
    stretch = 1.0
    if rng.random() < stretch_share:
        stretch = float(math.exp(rng.uniform(0.0, math.log(max_stretch))))
    seeds = rng.integers(0, EVAL_SEED0, batch_size)
    world = WorldConfig(duration_s=duration, min_objects=phase.objects[0], max_objects=phase.objects[1])
    samples = [data.sample(int(s), world) for s in seeds]
    kw, labels, P = data.batch(samples, stretch)
    for group in opt.param_groups:
        group["lr"] = lr
    logits = model(**kw).logits
    loss = _loss(logits, labels)
    seen = torch.from_numpy(np.concatenate([s.labels for s in samples]))  # [visual tokens, 4]
    total = loss + cfg.vision_aux_weight * heads.loss(tap.take(), seen)
    opt.zero_grad(set_to_none=True)
    total.backward()
    torch.nn.utils.clip_grad_norm_([*model.parameters(), *heads.parameters()], 1.0)
    opt.step()
    return float(loss.detach()), _content_accuracy(logits.detach(), samples, P)


def _content_accuracy(logits, samples, P: int) -> float:
    """Share of shape/size/motion words predicted right in this batch (the video-only words)."""
    pred = logits.argmax(-1)
    hits = [ok for b, s in enumerate(samples) for cat, ok in _word_hits(pred[b], s, P)
            if cat in ("shape", "size", "motion")]
    return sum(hits) / max(1, len(hits))


def _word_hits(pred, sample, P: int) -> list[tuple[str, bool]]:
    """pred [L] argmax tokens of one sequence whose caption starts at P -> (category, right) per word."""
    correct = [int(pred[P + j - 1]) == t for j, t in enumerate(sample.caption_ids)]
    return word_hits(correct, sample.categories)


def _loss(logits, labels):
    # logits [B, L, V]: position j predicts token j + 1
    return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(),
                                             ignore_index=-100)


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
        hit = {c: 0 for c in data.language.categories}
        tot = {c: 0 for c in data.language.categories}
        for i in range(0, len(group), per_batch):
            chunk = group[i:i + per_batch]
            kw, labels, P = data.batch(chunk, stretch)
            pred = model(**kw).logits.argmax(-1)  # [B, L]
            for b, s in enumerate(chunk):
                for cat, ok in _word_hits(pred[b], s, P):
                    tot[cat] += 1
                    hit[cat] += ok
        acc = {c: round(hit[c] / max(1, tot[c]), 4) for c in data.language.categories}
        acc["all"] = round(sum(hit.values()) / sum(tot.values()), 4)
        result[name] = acc
    if was_training:
        model.train()
    return result


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


def _recipe_changes(saved: dict, cfg: TargetTrainConfig) -> list[str]:
    """Knobs whose value differs from the checkpoint's, except those that do not change the
    weights (threads, how often to eval and save)."""
    def normal(value) -> str:  # tuples and lists alike, as a checkpoint may store either
        return json.dumps(value, sort_keys=True, default=str)

    now, defaults = asdict(cfg), asdict(TargetTrainConfig())
    # a knob the checkpoint predates was at its default then
    return sorted(k for k in now if k not in ("threads", "eval_every", "save_every")
                  and normal(saved.get(k, defaults[k])) != normal(now[k]))


def _optimizer(model, heads: VisionHeads, cfg: TargetTrainConfig):
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embed" not in n] + list(heads.parameters())
    rest = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embed" not in n)]
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": rest, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.98))


def _cosine(peak: float, step: int, warmup: int, frac: float) -> float:
    """Linear warmup over `warmup` steps, then cosine to 5% of `peak` at `frac` = 1."""
    warm = min(1.0, (step + 1) / warmup)
    return peak * warm * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def _save(model, heads: VisionHeads, opt, state, cfg: TargetTrainConfig, out: Path) -> None:
    atomic_torch_save(out / "train_state.pt", dict(  # a kill mid-save keeps the last checkpoint
        model=model.state_dict(), heads=heads.state_dict(), opt=opt.state_dict(), state=state, config=asdict(cfg)))
