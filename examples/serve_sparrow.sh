#!/usr/bin/env bash
# Serve a video LLM with Sparrow speculative decoding (OpenAI-compatible API on 127.0.0.1:8000).
#   examples/serve_sparrow.sh TARGET DRAFT MEDIA_DIR [more `vllm serve` flags]
# MEDIA_DIR: the one folder whose videos file:// URLs may read (a dedicated folder, not your home
# or working directory). Listens on 127.0.0.1 only; put an authenticating proxy in front, or pass
# --host 0.0.0.0 --api-key KEY yourself, before exposing it. Flags after MEDIA_DIR are passed to
# `vllm serve` after the ones below, so they override them (e.g. --port 8001).
#
# Sized for long videos: vLLM refuses a video with more visual tokens than its encoder cache, and
# sizes that cache from --max-num-batched-tokens (or its own estimate of the largest video, when
# larger). 32768 holds every bundled clip (world_384s.mp4 is 6,144 visual tokens) and a 7B target's
# ~25k-token long videos; pass a larger --max-num-batched-tokens for longer ones.
# Exactness: in float32 greedy answers are the target's token for token, and sampled ones follow its
# distribution. vLLM serves in the checkpoint's dtype on a GPU (bfloat16 for Qwen-VL) and a float32
# checkpoint in bfloat16 on its CPU build; in bfloat16 the verify step scores a request's tokens in
# another batch shape than a plain decode step does, so a near-tie can flip, as it does when the
# target alone is batched differently. Pass --dtype float32 for token-for-token answers.
# Depth: the draft's recommended one (its config.json); add "num_speculative_tokens": K to the
# speculative config to change it.
# Needs the project's venv active (`make setup`, then `. .venv/bin/activate`). On vLLM's CPU build
# this sets VLLM_CPU_KVCACHE_SPACE (GiB of KV cache, default 4 here) and preloads the venv's Intel
# OpenMP (vLLM's CPU backend runs much slower without it) unless you did.
set -euo pipefail
TARGET=${1:?target model directory or hub id}
DRAFT=${2:?Sparrow draft directory}
MEDIA=${3:?folder of videos the server may read (file:// URLs)}
shift 3
VLLM=$(command -v vllm) || { echo "vllm is not on PATH: activate the project's venv (. .venv/bin/activate)" >&2; exit 2; }
IOMP="$(dirname "$VLLM")/../lib/libiomp5.so"  # only the CPU build's venv has it
if [[ -f "$IOMP" ]]; then
  export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-4}
  IOMP=$(cd "$(dirname "$IOMP")" && pwd)/libiomp5.so
  [[ ":${LD_PRELOAD:-}:" == *":$IOMP:"* ]] || export LD_PRELOAD="$IOMP${LD_PRELOAD:+:$LD_PRELOAD}"
fi
# PyAV decodes the videos: a codec under the model's own loader on vLLM 0.32/0.33 (the plugin adds it),
# a loader of its own on 0.34 (chosen by video_backend), told whose frame choice to keep: the
# target's (Qwen2-VL / Qwen2.5-VL: qwen2_vl, Qwen3-VL: qwen3_vl; others: vLLM's default, uniform).
PY="$(dirname "$VLLM")/python"
case "$("$PY" -c 'import vllm; print(vllm.__version__)' 2>/dev/null)" in
  0.34.*)
    TYPE=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1] + "/config.json"))["model_type"])' \
           "$TARGET" 2>/dev/null || true)
    case "$TYPE" in
      qwen2_vl|qwen2_5_vl) RULE=qwen2_vl ;;
      qwen3_vl|qwen3_vl_moe) RULE=qwen3_vl ;;
      *) RULE=opencv ;;
    esac
    VIDEO="{\"video\": {\"video_backend\": \"pyav\", \"sampling\": \"$RULE\"}}" ;;
  *) VIDEO='{"video": {"backend": "pyav"}}' ;;
esac
exec "$VLLM" serve "$TARGET" \
  --host 127.0.0.1 --port 8000 \
  --speculative-config "{\"method\": \"sparrow\", \"model\": \"$DRAFT\"}" \
  --allowed-local-media-path "$(cd "$MEDIA" && pwd)" \
  --max-num-batched-tokens 32768 \
  --media-io-kwargs "$VIDEO" \
  --limit-mm-per-prompt '{"video": 1, "image": 1}' \
  "$@"
