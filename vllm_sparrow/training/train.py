"""`sparrow train`: stage 1 + IVSB + MTP on captured samples; resumable; exports a plugin draft.

Run directory:
  train_config.json      the TrainConfig of the run (a resume must use the same)
  checkpoint.pt          draft + bridge + optimizer + step + place in the sample stream, every
                         `save_every` steps
  draft/                 the exported Sparrow draft (config.json + model.safetensors)
  log.jsonl              one line per logged step / validation (and the depth chosen, depth.py)
Deterministic for a given seed and configuration: the samples form one global stream (epoch e
is a permutation drawn from (seed, e) alone) and each sample's random draws (its IVSB visual
subset and dropout) come from (seed, its place in the stream), never from a generator that other
samples advance; a checkpoint holds how far along the stream the run is, so resuming is exact.

Data parallel: launch with torchrun. Each optimiser step takes the next batch_samples x
world_size places of the stream, rank r every world_size-th of them from the r-th; gradients
(draft and bridge) are averaged over the ranks before the step. So R ranks with batch_samples b
see, per step, the samples 1 rank with batch_samples R x b sees, draw the same random subsets for
them and step with the same mean gradient: the weights agree up to the order floating-point
sums are taken in (exactly, for b = 1 and R = 2). The logged loss and top-1 are over every
rank's samples.
"""

from __future__ import annotations

import json
import logging
import os
import random
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..knobs import knob, optional_window
from ..config import MAX_SPECULATIVE_TOKENS, SparrowConfig
from ..durable import append_jsonl, atomic_torch_save, atomic_write_json, atomic_write_text, read_jsonl
from .acceptance import AcceptanceEstimate
from .depth import DepthChoice, choose_depth
from .ivsb import VisualBridge, visual_shown
from .recipes import recipe_for
from .capture import CaptureConfig
from .online import OnlineSamples
from .shards import ShardReader

log = logging.getLogger("vllm_sparrow.train")


@dataclass
class TrainConfig:
    """`sparrow train`: every option is a field here (knobs.py)."""

    out: str = knob(help="run directory; the draft lands in OUT/draft (rerun to resume)")
    capture: str | None = knob(None, "capture directory (sparrow capture); or --online")
    online: bool = knob(False, "compute the target's states inside training, never stored (long videos): "
                               "needs --target and --data; the capture options below say how")
    target: str | None = knob(None, "target model directory (--online)")
    data: str | None = knob(None, "JSONL of samples (--online; sparrow respond writes their responses once)")
    num_frames: int = knob(CaptureConfig.num_frames, "frames per video (--online)", flag="--frames")
    ivsb_layer: int | None = knob(None, "target layer of the IVSB states (--online; omit: capture's default)")
    max_new_tokens: int = knob(CaptureConfig.max_new_tokens, "longest response the target writes (--online)")
    max_seq_len: int = knob(CaptureConfig.max_seq_len, "longer samples are skipped (--online)")
    init: str | None = knob(None, "draft directory to start from (omit: random init for the target)")
    draft_kind: str = knob("sparrow", "sparrow, or the baselines eagle / eagle3 (vLLM's methods 'eagle' / "
                           "'eagle3'; eagle3 needs a capture made with --eagle3)",
                           choices=("sparrow", "eagle", "eagle3"))
    steps: int = knob(1000, "optimiser steps")
    batch_samples: int = knob(1, "samples per optimiser step (gradient accumulation)")
    lr: float = knob(3e-4, "peak learning rate")
    weight_decay: float = knob(0.0, "AdamW weight decay")
    warmup_steps: int = knob(0, "linear warm-up steps")
    hidden_loss_weight: float = knob(0.1, "weight of the next-state regression beside the next-token loss")
    mtp_steps: int = knob(2, "MTP stages after stage 1 (0: stage 1 only)")
    mtp_weight: float = knob(0.5, "stage s loss weight = mtp_weight ** s")
    ivsb: bool = knob(True, "ablation: no intermediate visual states in training", flag="--no-ivsb")
    visual_fraction: float = knob(1.0, "share of a sample's visual states shown (0, 0.5, 1 in the paper)")
    visual_drop: float = knob(0.0, "share of samples trained with no visual states (IVSB dropout: the draft "
                                   "serves without them)")
    loss_on_prompt: bool = knob(False, "score prompt text tokens too (vLLM drafts only after the prompt)")
    anchor_tokens: int = knob(SparrowConfig.anchor_tokens, "anchor text tokens A (random init only)",
                              flag="--anchors")
    window_tokens: int | None = knob(SparrowConfig.window_tokens, "window text tokens W, or 'none' for all "
                                     "(random init only)", flag="--window", parse=optional_window)
    speculative_tokens: int | None = knob(
        None, f"depth the exported draft recommends (its speculative_tokens) and of the validation replay; omit: "
              f"replay at {MAX_SPECULATIVE_TOKENS} and record the depth with the most tokens per unit of step cost "
              "(--draft-step-cost, --verify-token-cost)", flag="--k")
    draft_step_cost: float = knob(0.1, "cost of one draft forward relative to a verify step, for the recorded "
                                       "depth (0.1: a one-layer draft of a 7B target on a GPU)")
    verify_token_cost: float = knob(0.1, "cost of one more verified token relative to a verify step's fixed cost, "
                                         "for the recorded depth (as in calibrate-stop)")
    holdout: int = knob(2, "last N captured samples: validation only")
    val_every: int = knob(0, "validate every N steps (0: at the end only)")
    save_every: int = knob(100, "checkpoint every N steps")
    log_every: int = knob(10, "log every N steps")
    seed: int = knob(0, "seed of initialisation, sample order and IVSB dropout")
    device: str = knob("cpu", "torch device (cuda under torchrun: one rank per GPU)")
    extra: dict = knob(default_factory=dict, cli=False)


@dataclass
class TrainResult:
    steps: int
    last_loss: float
    top1: float  # stage-1 top-1 agreement over the last log window
    acceptance: AcceptanceEstimate | None
    draft_dir: Path
    already_done: bool = False  # the run had reached --steps before this call (nothing trained)
    depth: DepthChoice | None = None  # chosen from the final replay (Sparrow drafts, no --k given)


def train(cfg: TrainConfig, progress: bool = True) -> TrainResult:
    rank, world, owns_group = _dist_init(cfg.device)
    try:
        result = _train(cfg, progress, rank, world)
    except BaseException:
        if owns_group:  # local teardown only: the other ranks fail on their own collectives
            torch.distributed.destroy_process_group()
        raise
    if owns_group:
        # A rank that left while rank 0 still exported and validated tore its gloo pairs down under
        # live peers, and a CI run saw that rank abort (SIGABRT) at exit: all wait, then leave.
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return result


def _train(cfg: TrainConfig, progress: bool, rank: int, world: int) -> TrainResult:
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    _check_config(out, cfg, rank)
    reader = _open_samples(cfg)
    if cfg.online:
        draft, target, bridge = _build(cfg, cfg.target, out, rank, world)
        reader = OnlineSamples(cfg, target)  # the training's own target computes the states
    else:
        _check_capture(cfg, reader)
        draft, target, bridge = _build(cfg, reader.manifest.settings["target"], out, rank, world)
    if len(reader) <= cfg.holdout:
        raise TrainingRefused(f"{cfg.capture or cfg.data} has {len(reader)} samples; need more than "
                              f"--holdout {cfg.holdout}")
    train_idx = list(range(len(reader) - cfg.holdout))
    val_idx = list(range(len(reader) - cfg.holdout, len(reader)))
    params = [p for n, p in draft.named_parameters() if not n.startswith(("embed_tokens", "lm_head"))]
    params += list(bridge.parameters())
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    state = _resume(out, draft, bridge, opt)
    return _loop(cfg, out, reader, train_idx, val_idx, draft, target, bridge, opt, state, rank, world,
                 progress)


def _loop(cfg, out, reader, train_idx, val_idx, draft, target, bridge, opt, state, rank, world,
          progress) -> TrainResult:
    from tqdm import tqdm

    stream = SampleStream(cfg.seed, train_idx)
    step = state.get("step", 0)
    position = state.get("position", step * cfg.batch_samples * world)  # next place in the stream
    if state.get("world_size", world) != world and rank == 0:
        log.warning("%s was trained on %d ranks and resumes on %d: each step now takes %d samples, so the "
                    "weights will differ from a run that kept its ranks", out, state["world_size"], world,
                    cfg.batch_samples * world)
    window = _empty_window()
    bar = tqdm(total=cfg.steps, initial=step, desc="train", disable=not progress or rank != 0)
    logged = ([{}] + [r for r in read_jsonl(out / "log.jsonl", repair=False) if "loss" in r])[-1]  # a resumed run's last window
    last_loss, top1 = logged.get("loss", float("nan")), logged.get("top1", float("nan"))
    already_done = step >= cfg.steps
    while step < cfg.steps:
        _set_lr(opt, cfg, step)
        opt.zero_grad()
        for place in rank_places(position, cfg.batch_samples, rank, world):
            _train_sample(cfg, reader, stream, place, step, draft, target, bridge, window)
        _average_grads(opt, world)
        opt.step()
        step, position = step + 1, position + cfg.batch_samples * world
        window["n"] += 1
        if step % cfg.log_every == 0 or step == cfg.steps:
            last_loss, top1 = _global_window(window, world, cfg.device)
            bar.set_postfix(loss=f"{last_loss:.3f}", top1=f"{top1:.2f}")
            _log(out, rank, {"step": step, "loss": last_loss, "top1": top1})
            window = _empty_window()
        if rank == 0 and (step % cfg.save_every == 0 or step == cfg.steps):
            atomic_torch_save(out / "checkpoint.pt", {  # a kill mid-save keeps the previous one
                "step": step, "draft": draft.state_dict(), "bridge": bridge.state_dict(),
                "opt": opt.state_dict(), "position": position, "world_size": world})
        if cfg.val_every and step % cfg.val_every == 0 and step < cfg.steps and rank == 0:
            _validate(cfg, out, reader, val_idx, draft, target, step)
        bar.update(1)
    bar.close()
    draft_dir = out / "draft"
    acceptance = depth = None
    if rank == 0:  # export first: a validation that fails (a damaged shard) must not cost the draft
        recipe_for(cfg.draft_kind).save(draft, draft_dir, cfg)
        try:
            acceptance = _validate(cfg, out, reader, val_idx, draft, target, step)
            depth = _record_depth(cfg, out, draft_dir, acceptance, step)
        except Exception as e:  # noqa: BLE001 - the exported draft stands whatever validation does
            log.warning("final validation failed (%s); the draft was exported to %s", e, draft_dir)
    return TrainResult(step, last_loss, top1, acceptance, draft_dir, already_done, depth)


class SampleStream:
    """The training samples as one endless stream: epoch e is a permutation of them drawn from
    (seed, e) alone, so every rank and every resume sees the same stream without sharing state."""

    def __init__(self, seed: int, train_idx: list[int]) -> None:
        self.seed, self.train_idx, self._epoch = seed, train_idx, (-1, [])

    def __getitem__(self, place: int) -> int:
        """The capture position of the sample at `place` in the stream."""
        epoch, offset = divmod(place, len(self.train_idx))
        if self._epoch[0] != epoch:
            gen = torch.Generator().manual_seed(derived_seed(self.seed, "epoch", epoch))
            self._epoch = (epoch, torch.randperm(len(self.train_idx), generator=gen).tolist())
        return self.train_idx[self._epoch[1][offset]]


def derived_seed(*parts) -> int:
    """A 63-bit seed that depends on `parts` alone (string seeding is stable across processes)."""
    return random.Random(":".join(map(str, parts))).getrandbits(63)


def rank_places(position: int, batch_samples: int, rank: int, world: int) -> range:
    """The stream places rank `rank` trains on in the step that starts at `position`: every
    world-th of the step's batch_samples x world places, from the rank-th. Over the ranks they are
    the places one process with batch_samples x world takes, whatever the number of samples."""
    return range(position + rank, position + batch_samples * world, world)


def _train_sample(cfg, reader, stream, place, step, draft, target, bridge, window) -> None:
    """Forward and backward of the sample at `place` (its loss scaled to its share of the
    step); a sample that cannot train adds nothing (the gradient average still counts it)."""
    index = stream[place]
    sample = _load(reader, index)
    if sample is None:
        return
    # Its own generator: the visual subset depends on (seed, place) only, not on which rank took
    # the samples before it.
    gen = torch.Generator().manual_seed(derived_seed(cfg.seed, "sample", place))
    stages = recipe_for(cfg.draft_kind).stages(cfg, draft, target, bridge, sample, gen,
                                               visual_shown(cfg, step, index))
    loss = sum((cfg.mtp_weight ** s) * r.loss for s, r in enumerate(stages)) / cfg.batch_samples
    loss.backward()
    window["loss"] += loss.item()
    window["correct"] += stages[0].correct
    window["scored"] += stages[0].scored


def _empty_window() -> dict:
    return {"loss": 0.0, "correct": 0, "scored": 0, "n": 0}


def _global_window(window: dict, world: int, device: str) -> tuple[float, float]:
    """(mean loss per step, top-1) of the log window over every rank's samples: each rank holds
    its share of each step's loss (summed over its samples, scaled by 1/batch_samples), so the
    step's loss over the global batch is the ranks' sum / world. Every rank must call it."""
    totals = torch.tensor([window["loss"], window["correct"], window["scored"]], dtype=torch.float64,
                          device=device)  # on the rank's device: NCCL reduces GPU tensors only
    if world > 1:
        torch.distributed.all_reduce(totals)
    loss, correct, scored = totals.tolist()
    return loss / world / window["n"], correct / max(1.0, scored)


def _record_depth(cfg: TrainConfig, out: Path, draft_dir: Path, est: AcceptanceEstimate,
                  step: int) -> DepthChoice | None:
    """Without --k, the depth the replay measured best (depth.py), logged (export of a checkpoint
    reads it back); a Sparrow draft records it in its config.json (the baselines' vLLM formats
    have no such field: the command names it in the config to serve them with)."""
    if cfg.speculative_tokens is not None:
        return None
    if not est.drafts:
        log.warning("no held-out sample was long enough to replay a draft: no depth chosen for %s", draft_dir)
        return None
    choice = choose_depth(est, cfg.draft_step_cost, cfg.verify_token_cost)
    if cfg.draft_kind == "sparrow":
        SparrowConfig.load(draft_dir).replace(speculative_tokens=choice.depth).save(draft_dir)
    _log(out, 0, {"step": step, "recommended_depth": choice.depth, "tokens_per_step": choice.tokens_per_step,
                  "speed": choice.speed})
    log.info("%s", choice.summary())
    return choice


def recorded_depth(run: Path) -> int | None:
    """The depth the run's last final validation chose (None: none chosen yet)."""
    rows = [r for r in read_jsonl(run / "log.jsonl", repair=False) if "recommended_depth" in r]
    return rows[-1]["recommended_depth"] if rows else None


def _load(reader, pos: int) -> dict | None:
    """A captured sample, or None (logged) when it cannot train: one bad sample never stops a run."""
    try:
        sample = reader[pos]
    except Exception as e:  # a damaged shard file
        log.warning("skipping captured sample at position %d: unreadable (%s)", pos, e)
        return None
    if int((~sample["is_visual"]).sum()) < 3:
        log.warning("skipping captured sample at position %d: fewer than 3 text tokens", pos)
        return None
    return sample


def _validate(cfg, out, reader, val_idx, draft, target, step) -> AcceptanceEstimate:
    samples = (s for s in (_load(reader, i) for i in val_idx) if s is not None)  # a damaged shard skips its samples
    est = recipe_for(cfg.draft_kind).validate(cfg, draft, target, samples)
    _log(out, 0, {"step": step, "val_mean_acceptance_length": est.mean_acceptance_length,
                  "val_drafts": est.drafts, "val_per_position": est.per_position})
    log.info("step %d: simulated mean acceptance length %.3f over %d drafts", step,
             est.mean_acceptance_length, est.drafts)
    return est


def _build(cfg: TrainConfig, target_dir: str, out: Path, rank: int, world: int):
    from .target_runner import HFTarget

    recipe = recipe_for(cfg.draft_kind)
    init = Path(cfg.init) if cfg.init else out / "init"
    if rank == 0 and not cfg.init and not (init / "config.json").is_file():
        recipe.init(cfg, target_dir, init)
    if world > 1:
        torch.distributed.barrier()  # every rank starts from the same initial draft
    draft = recipe.load(init, cfg)
    target = HFTarget(target_dir, device=cfg.device)
    for p in target.model.parameters():
        p.requires_grad_(False)
    torch.manual_seed(cfg.seed)
    bridge = VisualBridge(target.spec.hidden_size, draft.cfg.hidden_size, draft.cfg.rms_norm_eps).to(cfg.device)
    draft.train()
    return draft, target, bridge


def _resume(out: Path, draft, bridge, opt) -> dict:
    path = out / "checkpoint.pt"
    if not path.is_file():  # a fresh start, perhaps after a run killed before its first save
        _trim_log(out / "log.jsonl", 0)
        return {}
    ckpt = torch.load(path, weights_only=False, map_location="cpu")  # resumable on another device
    draft.load_state_dict(ckpt["draft"])
    bridge.load_state_dict(ckpt["bridge"])
    opt.load_state_dict(ckpt["opt"])
    log.info("resuming %s at step %d", out, ckpt["step"])
    _trim_log(out / "log.jsonl", ckpt["step"])
    return ckpt


def _trim_log(path: Path, step: int) -> None:
    """Drop log rows past the checkpoint a killed run resumes from: they are redone."""
    rows = read_jsonl(path)
    keep = [r for r in rows if r.get("step", 0) <= step]
    if len(keep) != len(rows):
        atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in keep))


class TrainingRefused(ValueError):
    """A run that cannot start as asked; the message says what to do (the CLI prints it alone)."""


class RunSettingsChanged(TrainingRefused):
    """The output directory holds a run with other settings."""


ONLINE_SETTINGS = ("online", "target", "data", "num_frames", "ivsb_layer", "max_new_tokens", "max_seq_len")


def _open_samples(cfg: TrainConfig) -> ShardReader | None:
    """The capture to train from, or None with --online (which needs a target and data, and no capture)."""
    if cfg.online:
        if not (cfg.target and cfg.data) or cfg.capture:
            raise TrainingRefused("--online computes the states from --target and --data: give both, and no "
                                  "--capture")
        return None
    if not cfg.capture:
        raise TrainingRefused("give --capture CAPTURE (sparrow capture), or --online --target T --data D")
    return ShardReader(cfg.capture)


def _check_capture(cfg: TrainConfig, reader: ShardReader) -> None:
    """A baseline trains on states only a capture made with its flag holds: refused before any
    work, not at the first sample."""
    flag = recipe_for(cfg.draft_kind).capture_flag
    if flag and not reader.manifest.settings.get(flag):
        raise TrainingRefused(f"{cfg.capture} was captured without --{flag.replace('_', '-')}, and a "
                              f"{cfg.draft_kind} draft trains on the states it adds: capture again with "
                              f"--{flag.replace('_', '-')} (into a new --out) and train on that")


def settings_changed(out: Path, cfg: TrainConfig) -> list[str]:
    """Settings in which the run in `out` differs from `cfg` (none for a new run: it may resume)."""
    path = out / "train_config.json"
    if not path.is_file():
        return []
    old, mine = json.loads(path.read_text()), _resumable_settings(cfg)
    return sorted(k for k in mine if old.get(k) != mine[k])


def _resumable_settings(cfg: TrainConfig) -> dict:
    # Not compared: how long and how often (steps may grow), the device, where the run lies (a run
    # moved or copied to another folder resumes there), and the step costs, which only choose the
    # recorded depth (a finished run rerun with other costs replays and records it again).
    skip = ("steps", "val_every", "log_every", "device", "out", "draft_step_cost", "verify_token_cost")
    if not cfg.online:  # absent from runs trained from a capture (older runs resume as they were)
        skip += ONLINE_SETTINGS
    return {k: v for k, v in asdict(cfg).items() if k not in skip}


def _check_config(out: Path, cfg: TrainConfig, rank: int) -> None:
    diff = settings_changed(out, cfg)
    if diff:
        old, mine = json.loads((out / "train_config.json").read_text()), _resumable_settings(cfg)
        changes = ", ".join(f"{k}: {old.get(k)!r} there, {mine[k]!r} now" for k in diff)
        raise RunSettingsChanged(f"{out} is a run with other settings ({changes}); use a new "
                                 "--out, or the same settings to resume (only --steps may grow)")
    if rank == 0 and not (out / "train_config.json").is_file():
        atomic_write_json(out / "train_config.json", _resumable_settings(cfg))


def _set_lr(opt, cfg: TrainConfig, step: int) -> None:
    scale = min(1.0, (step + 1) / cfg.warmup_steps) if cfg.warmup_steps else 1.0
    for group in opt.param_groups:
        group["lr"] = cfg.lr * scale


def _log(out: Path, rank: int, row: dict) -> None:
    if rank == 0:
        append_jsonl(out / "log.jsonl", row)


def _dist_init(device: str) -> tuple[int, int, bool]:
    """(rank, world size, whether this call formed the process group) under torchrun (its
    WORLD_SIZE and LOCAL_RANK, which envs.py leaves to their owner), else (0, 1, False). NCCL for
    GPU training, gloo for CPU tensors; a group the caller formed is the caller's to destroy."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    formed = world > 1 and not torch.distributed.is_initialized()
    if formed:
        on_gpu = torch.device(device).type == "cuda"
        if on_gpu:  # before the group forms: "cuda" is then this rank's own GPU
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        torch.distributed.init_process_group("nccl" if on_gpu else "gloo")
    return (torch.distributed.get_rank(), world, formed) if world > 1 else (0, 1, False)


def _average_grads(opt, world: int) -> None:
    """Each gradient averaged over the ranks. A parameter no sample of the step touched on any rank
    (the bridge when no sample showed visual states) keeps no gradient, so AdamW skips it as one
    process would; one that some rank touched gets zeros from the others. Every rank joins every
    all-reduce, also a rank whose samples were all skipped."""
    if world == 1:
        return
    params = [p for group in opt.param_groups for p in group["params"]]
    touched = torch.tensor([p.grad is not None for p in params], dtype=torch.float32,
                           device=params[0].device)
    torch.distributed.all_reduce(touched)
    for p, anywhere in zip(params, touched.tolist()):
        if not anywhere:
            p.grad = None
            continue
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        torch.distributed.all_reduce(p.grad)
        p.grad /= world
