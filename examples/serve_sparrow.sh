#!/usr/bin/env bash
# Serve a video LLM with Sparrow speculative decoding (OpenAI-compatible API on 127.0.0.1:8000).
#   examples/serve_sparrow.sh TARGET DRAFT MEDIA_DIR
# MEDIA_DIR: the one folder whose videos file:// URLs may read (a dedicated folder, not your home
# or working directory). Listens on 127.0.0.1 only; put an authenticating proxy in front, or pass
# --host 0.0.0.0 --api-key KEY yourself, before exposing it.
# Needs the project's venv (`make setup`); on the CPU build also VLLM_CPU_KVCACHE_SPACE.
set -euo pipefail
TARGET=${1:?target model directory or hub id}
DRAFT=${2:?Sparrow draft directory}
MEDIA=${3:?folder of videos the server may read (file:// URLs)}
exec vllm serve "$TARGET" \
  --host 127.0.0.1 --port 8000 \
  --speculative-config "{\"method\": \"sparrow\", \"model\": \"$DRAFT\", \"num_speculative_tokens\": 3}" \
  --allowed-local-media-path "$(cd "$MEDIA" && pwd)" \
  --media-io-kwargs '{"video": {"backend": "pyav", "num_frames": 32}}' \
  --limit-mm-per-prompt '{"video": 1, "image": 1}'
