"""The `sparrow` command: init-draft, demo."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


def _init_draft(args) -> int:
    from .checkpoint import init_draft

    window = None if args.window in ("none", "null", "all") else int(args.window)
    out = init_draft(args.target, args.out, anchor_tokens=args.anchors, window_tokens=window,
                     speculative_tokens=args.k, seed=args.seed)
    print(f"wrote a randomly initialised Sparrow draft for {args.target} to {out}")
    return 0


def _demo(args) -> int:
    """Caption a generated clip with a tiny Qwen2.5-VL built on the spot (until the trained demo
    models ship): greedy with and without sparrow, same output, acceptance and decode speed."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    from .testing.engine import spec_counters
    from .testing.quick_draft import make_trained_draft
    from .testing.tiny_targets import build_tiny_target, make_prompt
    from .video import decode_video, write_synthetic_clip

    work = Path(args.workdir)
    target = build_tiny_target("qwen2_5_vl", work / "target")
    prompt = make_prompt("qwen2_5_vl", target, "describe the video", "video")
    tok = AutoTokenizer.from_pretrained(str(target))
    draft = work / "draft"
    if not (draft / "model.safetensors").exists():
        print("distilling a small draft on the target's own outputs ...", flush=True)
        make_trained_draft(target, draft, prompts=[tok(make_prompt("qwen2_5_vl", target, "describe the video", None),
                                                       add_special_tokens=False)["input_ids"]], steps=150)
    clip = write_synthetic_clip(work / "clip.mp4", args.frames, seed=1)
    req = {"prompt": prompt, "multi_modal_data": {"video": decode_video(clip, num_frames=args.frames)}}
    sp = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    common = dict(model=str(target), enforce_eager=True, dtype="float32", max_model_len=8192,
                  max_num_batched_tokens=8192, limit_mm_per_prompt={"video": 1})
    runs = {}
    for name, extra in (("no speculation", {}), ("sparrow", {"disable_log_stats": False, "speculative_config": {
            "method": "sparrow", "model": str(draft), "num_speculative_tokens": 3}})):
        llm = LLM(**common, **extra)
        t0 = time.perf_counter()
        out = llm.generate([req], sp, use_tqdm=False)[0]
        runs[name] = (time.perf_counter() - t0, out, spec_counters(llm) if extra else None)
        del llm
    (t_base, base, _), (t_sp, spar, c) = runs["no speculation"], runs["sparrow"]
    print(f"\nvideo: {args.frames} frames, {len(spar.prompt_token_ids)} prompt tokens")
    print(f"caption (sparrow): {spar.outputs[0].text!r}")
    print(f"identical to the target's greedy output: {list(base.outputs[0].token_ids) == list(spar.outputs[0].token_ids)}")
    if c and c["num_drafts"]:
        print(f"mean acceptance length (incl. bonus token): {1 + c['num_accepted_tokens'] / c['num_drafts']:.2f}")
    print(f"wall time for {args.max_tokens} tokens (incl. prefill): {t_base:.2f}s without, {t_sp:.2f}s with sparrow "
          f"(tiny random model on this machine's CPU: not a speed claim)")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="sparrow", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    i = sub.add_parser("init-draft", help="write a randomly initialised Sparrow draft for a target")
    i.add_argument("--target", required=True, help="target model directory (Hugging Face format)")
    i.add_argument("--out", required=True, help="draft directory to write")
    i.add_argument("--anchors", type=int, default=4, help="anchor text tokens A")
    i.add_argument("--window", default="512", help="window text tokens W, or 'none' for all")
    i.add_argument("--k", type=int, default=3, help="default number of speculative tokens")
    i.add_argument("--seed", type=int, default=0)
    i.set_defaults(fn=_init_draft)
    d = sub.add_parser("demo", help="caption a generated clip with and without sparrow")
    d.add_argument("--workdir", default="runs/demo")
    d.add_argument("--frames", type=int, default=32)
    d.add_argument("--max-tokens", type=int, default=64)
    d.set_defaults(fn=_demo)
    args = p.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
