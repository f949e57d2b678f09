"""Caption a folder (or JSONL) of videos with vLLM + Sparrow; resumable, one JSONL row per video.

    python examples/caption_batch.py --target Qwen/Qwen2.5-VL-7B-Instruct --draft path/to/draft \
        --inputs videos/ --out captions.jsonl [--frames 16 --max-tokens 256 --chunk 8]

Rerun the same command to continue after an interruption: finished ids are skipped.
"""

import argparse
import json

from vllm_sparrow.batch_caption import CaptionJob, caption_batch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True)
    p.add_argument("--draft", default=None, help="Sparrow draft directory (omit: no speculation)")
    p.add_argument("--k", type=int, default=3, help="speculative tokens per step")
    p.add_argument("--inputs", required=True, help="folder of videos or JSONL of {video, prompt?, id?}")
    p.add_argument("--out", required=True)
    p.add_argument("--prompt", default="Describe this video in detail.")
    p.add_argument("--frames", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--chunk", type=int, default=8)
    p.add_argument("--engine-args", default="{}", help='extra LLM(...) arguments as JSON, e.g. {"max_model_len": 32768}')
    a = p.parse_args()
    report = caption_batch(CaptionJob(
        inputs=a.inputs, out=a.out, target=a.target, draft=a.draft, num_speculative_tokens=a.k,
        prompt=a.prompt, num_frames=a.frames, max_tokens=a.max_tokens, chunk=a.chunk,
        engine_args=json.loads(a.engine_args)))
    print(report.summary())


if __name__ == "__main__":
    main()
