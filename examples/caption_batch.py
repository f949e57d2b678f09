"""Caption a folder (or JSONL) of videos with vLLM + Sparrow; resumable, one JSONL row per video.

    python examples/caption_batch.py --target Qwen/Qwen2.5-VL-7B-Instruct --draft path/to/draft \
        --inputs videos/ --out captions.jsonl [--frames 16 --max-tokens 256 --chunk 8]

The same as `sparrow caption ...` (this file only forwards its arguments). Rerun the same command
to continue after an interruption, even a kill -9: finished ids are skipped, a torn last row is
redone.
"""

import sys

from vllm_sparrow.cli import main

if __name__ == "__main__":
    sys.exit(main(["caption", *sys.argv[1:]]))
