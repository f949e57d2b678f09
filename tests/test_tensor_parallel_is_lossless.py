"""Tensor parallelism (TP=2, vLLM's CPU build: two worker processes, one core each; on CUDA, two
GPUs): greedy outputs with sparrow equal the target's own under the same TP, on text and video
prompts. The draft's weights are replicated per rank; the target's embedding and LM head it
reuses are the vocabulary-sharded ones vLLM gathers."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import DEMO_MODELS, gpu_share, on_cuda

# On CPU the two ranks are processes on one machine (gloo); on CUDA each rank needs a GPU of its own.
pytestmark = pytest.mark.skipif(on_cuda() and torch.cuda.device_count() < 2,
                                reason=f"TP=2 on CUDA needs two GPUs; torch sees {torch.cuda.device_count()}")

SCRIPT = textwrap.dedent("""
    import json, sys
    from vllm import LLM, SamplingParams
    from sparrow_world.bench.clips import eval_clips
    from sparrow_world.tiny_targets import make_prompt
    from vllm_sparrow.video import decode_video

    def main():
        models, out, spec, share = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
        target = models + "/target"
        clip = eval_clips(out + "-clips", (512,), 1, 30_000_000)[512][0]
        reqs = [{"prompt": make_prompt("qwen2_5_vl", target, "describe the video .", "video"),
                 "multi_modal_data": {"video": decode_video(clip.path)}},
                {"prompt": make_prompt("qwen2_5_vl", target, "describe the red square moving left", None)}]
        llm = LLM(model=target, enforce_eager=True, dtype="float32", max_model_len=2048, tensor_parallel_size=2,
                  distributed_executor_backend="mp", limit_mm_per_prompt={"video": 1}, speculative_config=spec,
                  **share)
        outs = llm.generate(reqs, SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True), use_tqdm=False)
        json.dump([list(o.outputs[0].token_ids) for o in outs], open(out, "w"))

    if __name__ == "__main__":
        main()
""")


def _run(tmp_path, name, spec):
    script = tmp_path / "tp2.py"
    script.write_text(SCRIPT)
    out = tmp_path / f"{name}.json"
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_CPU_OMP_THREADS_BIND": "0|1"}
    done = subprocess.run([sys.executable, str(script), DEMO_MODELS, str(out), json.dumps(spec), json.dumps(gpu_share())],
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text())


def test_sparrow_under_tp2_equals_the_target_under_tp2(tmp_path):
    plain = _run(tmp_path, "plain", None)
    sparrow = _run(tmp_path, "sparrow", {"method": "sparrow", "model": DEMO_MODELS + "/sparrow",
                                         "num_speculative_tokens": 3})
    assert sparrow == plain
    assert all(len(ids) == 48 for ids in plain)
