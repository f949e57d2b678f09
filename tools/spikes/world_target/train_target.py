"""Train a small Qwen2_5_VLForConditionalGeneration from scratch to caption vllm_sparrow.world videos.

Run (CPU):
  export LD_PRELOAD=/work/main/.venv/lib/libiomp5.so HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
  cd /tmp/spike && /work/main/.venv/bin/python train_target.py --minutes 30 --out runs/base
Logs JSON lines to <out>/log.jsonl (train loss, step time, held-out teacher-forced accuracy per
word category, on real and on blank videos) and saves a loadable HF folder to <out>/model.
"""
import argparse, json, os, sys, time
import numpy as np, torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import CATS, World, build_vocab, make_config, make_hf_tokenizer

ap = argparse.ArgumentParser()
ap.add_argument("--hidden", type=int, default=128)
ap.add_argument("--layers", type=int, default=2)
ap.add_argument("--vwidth", type=int, default=64)
ap.add_argument("--vdepth", type=int, default=1)
ap.add_argument("--rope-theta", type=float, default=1e6)
ap.add_argument("--lr", type=float, default=2e-3)
ap.add_argument("--wd", type=float, default=0.01)
ap.add_argument("--warmup", type=int, default=100)
ap.add_argument("--batch", type=int, default=8)
ap.add_argument("--steps", type=int, default=100000)
ap.add_argument("--minutes", type=float, default=30)
ap.add_argument("--eval-every", type=int, default=200)
ap.add_argument("--eval-n", type=int, default=48)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--duration", type=int, default=16)
ap.add_argument("--out", default="runs/base")
args = ap.parse_args()

torch.set_num_threads(args.threads)
torch.manual_seed(args.seed)
os.makedirs(args.out, exist_ok=True)
from transformers import Qwen2_5_VLForConditionalGeneration
from vllm_sparrow.world import WorldConfig

vocab = build_vocab()
cfg = make_config(vocab, hidden=args.hidden, layers=args.layers, vwidth=args.vwidth,
                  vdepth=args.vdepth, rope_theta=args.rope_theta)
model = Qwen2_5_VLForConditionalGeneration._from_config(cfg, dtype=torch.float32)
world = World(vocab, WorldConfig(duration_s=args.duration))
n_params = sum(p.numel() for p in model.parameters())
print(f"params {n_params/1e6:.2f}M (vision {sum(p.numel() for p in model.model.visual.parameters())/1e6:.2f}M)"
      f" visual tokens {world.n_vis}", flush=True)

decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embed" not in n]
nodecay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embed" not in n)]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.wd},
                         {"params": nodecay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.98))
total_s = args.minutes * 60


def lr_at(step, elapsed):
    warm = min(1.0, (step + 1) / args.warmup)
    frac = min(1.0, elapsed / total_s)  # cosine over the wall-clock budget
    return args.lr * warm * (0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * frac)))


def loss_and_preds(kw, labels):
    out = model(**kw)
    logits = out.logits[:, :-1].float()
    tgt = labels[:, 1:]
    mask = tgt != -100
    loss = torch.nn.functional.cross_entropy(logits[mask], tgt[mask])
    return loss, logits.argmax(-1), tgt, mask


eval_seeds = [10_000_000 + i for i in range(args.eval_n)]
eval_samples = [world.sample(s) for s in eval_seeds]


@torch.no_grad()
def evaluate(blank):
    model.eval()
    hit = {c: 0 for c in CATS}; tot = {c: 0 for c in CATS}; losses = []
    for i in range(0, len(eval_samples), 8):
        chunk = eval_samples[i:i + 8]
        kw, labels, cats = world.batch(chunk, blank=blank)
        loss, pred, tgt, mask = loss_and_preds(kw, labels)
        losses.append(loss.item())
        P = len(world.prefix)
        for b, c in enumerate(cats):
            for j, cat in enumerate(c):
                pos = P + j - 1  # logits index predicting token P+j
                tot[cat] += 1; hit[cat] += int(pred[b, pos] == tgt[b, pos])
    model.train()
    acc = {c: hit[c] / max(1, tot[c]) for c in CATS}
    acc["all"] = sum(hit.values()) / sum(tot.values())
    content = [c for c in CATS if c not in ("struct", "end")]
    acc["content"] = sum(hit[c] for c in content) / sum(tot[c] for c in content)
    return float(np.mean(losses)), acc


log = open(os.path.join(args.out, "log.jsonl"), "a")
rng = np.random.default_rng(args.seed + 12345)
t0 = time.time(); step = 0; ema = None; step_times = []
model.train()
while step < args.steps:
    elapsed = time.time() - t0
    if step % args.eval_every == 0 or elapsed > total_s:
        te = time.time()
        lv, av = evaluate(False); lb, ab = evaluate(True)
        rec = dict(step=step, elapsed=round(elapsed, 1), train_loss_ema=ema, eval_loss=lv,
                   blank_loss=lb, acc={k: round(v, 4) for k, v in av.items()},
                   blank_acc={k: round(v, 4) for k, v in ab.items()},
                   step_s=float(np.mean(step_times[-50:])) if step_times else None,
                   eval_s=round(time.time() - te, 1))
        log.write(json.dumps(rec) + "\n"); log.flush()
        print(f"[{step}] {elapsed:.0f}s ema {ema} eval {lv:.3f} blank {lb:.3f} | "
              + " ".join(f"{k}={av[k]:.3f}/{ab[k]:.3f}" for k in ["all", "content"] + CATS), flush=True)
        if elapsed > total_s:
            break
    ts = time.time()
    samples = [world.sample(int(s)) for s in rng.integers(0, 10_000_000, args.batch)]
    kw, labels, _ = world.batch(samples)
    for g in opt.param_groups:
        g["lr"] = lr_at(step, time.time() - t0)
    loss, _, _, _ = loss_and_preds(kw, labels)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    step_times.append(time.time() - ts)
    ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
    if step % 25 == 0:
        print(f"step {step} loss {loss.item():.3f} ema {ema:.3f} step_s {np.mean(step_times[-25:]):.2f}", flush=True)
        log.write(json.dumps(dict(step=step, loss=loss.item(), ema=ema, t=round(time.time() - t0, 1))) + "\n")
    step += 1

model.save_pretrained(os.path.join(args.out, "model"))
make_hf_tokenizer(vocab).save_pretrained(os.path.join(args.out, "model"))
print("saved", os.path.join(args.out, "model"))
