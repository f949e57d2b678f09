"""Shared fixtures: tiny targets built offline, trained drafts, video clips, engine settings.

Engines run in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0) and are shared per test module.
"""

import gc
import json
import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest

from sparrow_world.tiny_targets import build_tiny_target, make_prompt

# Prompts the quick drafts are distilled on (so text requests accept drafts).
TRAINED_TEXTS = ["describe the red square moving left", "what happens after the blue circle appears"]


@pytest.fixture(scope="session")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("sparrow")


@pytest.fixture(scope="session")
def target_dirs(workdir):
    cache = {}

    def get(kind: str):
        if kind not in cache:
            cache[kind] = build_tiny_target(kind, workdir / f"target-{kind}")
        return cache[kind]

    return get


@pytest.fixture(scope="session")
def trained_drafts(workdir, target_dirs):
    """A draft distilled on the target's own continuations of TRAINED_TEXTS (chat-templated)."""
    from transformers import AutoTokenizer

    from quick_draft import make_trained_draft

    cache = {}

    def get(kind: str):
        if kind not in cache:
            target = target_dirs(kind)
            tok = AutoTokenizer.from_pretrained(str(target))
            prompts = [tok(make_prompt(kind, target, t, None), add_special_tokens=False)["input_ids"]
                       for t in TRAINED_TEXTS]
            cache[kind] = make_trained_draft(target, workdir / f"draft-{kind}", prompts=prompts,
                                             steps=150, max_new_tokens=64)
        return cache[kind]

    return get


@pytest.fixture(scope="session")
def clips(workdir):
    """Decoded synthetic clips by frame count: (frames THWC uint8, metadata)."""
    from vllm_sparrow.video import decode_video, write_synthetic_clip

    cache = {}

    def get(num_frames: int, size: int = 112):
        key = (num_frames, size)
        if key not in cache:
            path = write_synthetic_clip(workdir / f"clip-{num_frames}-{size}.mp4", num_frames,
                                        width=size, height=size, seed=num_frames)
            cache[key] = decode_video(path, num_frames=num_frames)
        return cache[key]

    return get


ENGINE_DEFAULTS = dict(enforce_eager=True, dtype="float32", max_model_len=8192,
                       max_num_batched_tokens=8192, max_num_seqs=16,
                       limit_mm_per_prompt={"image": 1, "video": 1})


def make_llm(target, **overrides):
    from vllm import LLM

    return LLM(model=str(target), **{**ENGINE_DEFAULTS, **overrides})


def close_llm(llm):
    """Shut the engine down now. Leaving it to garbage collection is not enough: a stale engine
    collected while a newer one runs tears down the process-wide distributed groups."""
    llm.llm_engine.engine_core.shutdown()  # idempotent (its finalizer is detached)
    gc.collect()


DEMO_MODELS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models", "world")


@pytest.fixture(scope="session")
def small_capture(workdir, target_dirs):
    """Four 4-frame clips captured from the tiny Qwen2.5-VL target (training tests)."""
    from vllm_sparrow.training.capture import CaptureConfig, capture
    from vllm_sparrow.video import write_synthetic_clip

    root = workdir / "small-capture-data"
    root.mkdir()
    rows = []
    for i in range(4):
        write_synthetic_clip(root / f"v{i}.mp4", 4, width=112, height=112, seed=i)
        rows.append({"video": f"v{i}.mp4", "prompt": f"describe clip {i}"})
    (root / "data.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    capture(CaptureConfig(target=str(target_dirs("qwen2_5_vl")), data=str(root / "data.jsonl"), out=str(root / "cap"),
                          num_frames=4, max_new_tokens=12), progress=False)
    return root / "cap"


@pytest.fixture(scope="session")
def quick_bench(workdir):
    """`sparrow bench --quick` on the shipped demo models, every method plus an untrained Sparrow
    draft as an ablation: run once, read by the benchmark and the demo-model tests."""
    from sparrow_world.bench.config import BenchConfig, quick
    from sparrow_world.bench.run import run_bench
    from vllm_sparrow.checkpoint import init_draft

    untrained = init_draft(os.path.join(DEMO_MODELS, "target"), workdir / "untrained-world-draft",
                           window_tokens=128)
    cfg = quick(BenchConfig(target=os.path.join(DEMO_MODELS, "target"), sparrow=os.path.join(DEMO_MODELS, "sparrow"),
                            eagle=os.path.join(DEMO_MODELS, "eagle"), eagle3=os.path.join(DEMO_MODELS, "eagle3"),
                            out=str(workdir / "bench-quick"),
                            ablations={"untrained": str(untrained)}))
    records = run_bench(cfg)
    return cfg, {(r["method"], r["visual_tokens"], r["batch"]): r for r in records}
