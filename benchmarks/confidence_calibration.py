"""Which per-position confidence predicts Sparrow's acceptance better, for vLLM 0.34's adaptive
verification: the draft's own max probability, vLLM's estimator at its cold start, or the
estimator's logistic family fitted on other clips (what vLLM's online refit converges to).

    python benchmarks/confidence_calibration.py [--world hard] [--frames 64] [--max-new-tokens 160]

Captures the world's bundled clips (examples/videos) with the target's own greedy answers, replays
Sparrow's serving drafter over each (vLLM's greedy verify walk, training/acceptance.py's), and keeps,
for every drafted position a verifier reaches (the accepted ones and the first rejected, as vLLM's
estimator labels them), the draft distribution's max probability q and whether it was accepted.
Each confidence is scored by log-loss and Brier score over every clip, the fitted one
leave-one-clip-out: p = sigmoid(slope * logit(q) + b_k), slope shared, one intercept per position
(vLLM's OnlineAcceptanceEstimator). Prints one line per confidence; writes nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def points_of(draft, target, sample, k: int) -> list[tuple[int, float, int]]:
    """(position, max q, accepted) of every drafted position the verifier reaches in one sample:
    the accepted ones and the first rejected one (greedy drafts: the drawn token is the argmax, so
    its probability is the distribution's max)."""
    from vllm_sparrow.drafting.chain import ChainDrafting
    from vllm_sparrow.training.acceptance import replayed_chains

    out = []
    for drafts, accepted, reachable in replayed_chains(draft, target, sample, k, ChainDrafting(confidence=True)):
        conf = drafts.confidence[0].tolist()
        out += [(i, conf[i], int(i < accepted)) for i in range(min(accepted + 1, reachable))]
    return out


def logit(q: torch.Tensor) -> torch.Tensor:
    q = q.clamp(1e-7, 1 - 1e-7)
    return (q / (1 - q)).log().clamp(-40, 40)


def fit(points: list[tuple[int, float, int]], k: int, steps: int = 300) -> tuple[torch.Tensor, torch.Tensor]:
    """The estimator's family fitted by maximum likelihood: (slope, intercepts [k])."""
    pos = torch.tensor([x[0] for x in points])
    f, y = logit(torch.tensor([x[1] for x in points], dtype=torch.float64)), torch.tensor([float(x[2]) for x in points],
                                                                                          dtype=torch.float64)
    slope, bias = torch.ones(1, dtype=torch.float64, requires_grad=True), torch.zeros(k, dtype=torch.float64,
                                                                                      requires_grad=True)
    opt = torch.optim.LBFGS([slope, bias], max_iter=steps, line_search_fn="strong_wolfe")

    def loss():
        opt.zero_grad()
        value = torch.nn.functional.binary_cross_entropy_with_logits(slope * f + bias[pos], y)
        value.backward()
        return value

    opt.step(loss)
    return slope.detach(), bias.detach()


def scores(p: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    p = p.clamp(1e-7, 1 - 1e-7)
    return float(-(y * p.log() + (1 - y) * (1 - p).log()).mean()), float(((p - y) ** 2).mean())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", default="hard", choices=("hard", "easy"))
    ap.add_argument("--frames", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--k", type=int, default=None, help="draft depth (default: the draft's own)")
    args = ap.parse_args(argv)

    from vllm_sparrow.checkpoint import load_draft
    from vllm_sparrow.training.capture import CaptureConfig, capture
    from vllm_sparrow.training.shards import ShardReader
    from vllm_sparrow.training.target_runner import HFTarget

    models = ROOT / "models" / ("world-hard" if args.world == "hard" else "world")
    clips = sorted((ROOT / "examples" / "videos").glob("*.mp4"))
    with tempfile.TemporaryDirectory() as tmp:
        rows = [{"video": str(c), "prompt": "describe the video ."} for c in clips]
        (Path(tmp) / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        capture(CaptureConfig(target=str(models / "target"), data=str(Path(tmp) / "data.jsonl"), out=str(Path(tmp) / "cap"),
                              num_frames=args.frames, max_new_tokens=args.max_new_tokens, store_dtype="float32"),
                progress=False)
        samples = list(ShardReader(Path(tmp) / "cap"))
    draft = load_draft(str(models / "sparrow"), device="cpu", dtype=torch.float32).eval()
    k = args.k or draft.cfg.speculative_tokens
    target = HFTarget(str(models / "target"))
    with torch.no_grad():
        per_clip = [points_of(draft, target, s, k) for s in samples]
    rows = {"draft's own max q": [], "vLLM cold start (0.5, -0.2)": [], "fitted, leave one clip out": []}
    labels = []
    for i, pts in enumerate(per_clip):
        q = torch.tensor([x[1] for x in pts], dtype=torch.float64)
        pos = torch.tensor([x[0] for x in pts])
        labels.append(torch.tensor([float(x[2]) for x in pts], dtype=torch.float64))
        rows["draft's own max q"].append(q)
        rows["vLLM cold start (0.5, -0.2)"].append(torch.sigmoid(0.5 * logit(q) - 0.2))
        slope, bias = fit([x for j, other in enumerate(per_clip) if j != i for x in other], k)
        rows["fitted, leave one clip out"].append(torch.sigmoid(slope * logit(q) + bias[pos]))
    y = torch.cat(labels)
    slope, bias = fit([x for pts in per_clip for x in pts], k)
    print(f"{args.world} world, {len(samples)} clips, K={k}: {y.numel()} verified positions, acceptance rate "
          f"{float(y.mean()):.3f}; fitted on all clips: slope {float(slope):.2f}, intercepts "
          f"{[round(float(b), 2) for b in bias]}")
    for name, ps in rows.items():
        loss, brier = scores(torch.cat(ps), y)
        print(f"  {name:30s} log-loss {loss:.4f}  Brier {brier:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
