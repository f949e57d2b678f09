#!/usr/bin/env bash
# Serve a video LLM with Sparrow speculative decoding (OpenAI-compatible API on :8000).
#   examples/serve_sparrow.sh TARGET DRAFT [MEDIA_DIR]
# Needs the project's venv (`make setup`); on the CPU build also VLLM_CPU_KVCACHE_SPACE.
set -euo pipefail
TARGET=${1:?target model directory or hub id}
DRAFT=${2:?Sparrow draft directory}
MEDIA=${3:-$PWD}
exec vllm serve "$TARGET" \
  --speculative-config "{\"method\": \"sparrow\", \"model\": \"$DRAFT\", \"num_speculative_tokens\": 3}" \
  --allowed-local-media-path "$MEDIA" \
  --media-io-kwargs '{"video": {"backend": "pyav", "num_frames": 32}}' \
  --limit-mm-per-prompt '{"video": 1, "image": 1}'
