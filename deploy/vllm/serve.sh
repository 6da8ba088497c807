#!/usr/bin/env bash
# floe's vLLM production profile: the `vllm serve` command line that speaks the same token-level API as
# services/inference (see deploy/vllm/README.md). Every knob is an env var with the default floe expects;
# FLOE_VLLM_DRY_RUN=1 prints the command (one argument per line) instead of running it.
set -euo pipefail

MODEL="${FLOE_VLLM_MODEL:-/checkpoints/current}"            # a symlink the reload script re-points (README §weights)
SERVED_NAME="${FLOE_VLLM_SERVED_MODEL_NAME:-policy}"        # = FLOE_INFERENCE_SERVED_MODEL_NAME
HOST="${FLOE_VLLM_HOST:-0.0.0.0}"
PORT="${FLOE_VLLM_PORT:-8100}"                              # = FLOE_INFERENCE_PORT
MAX_MODEL_LEN="${FLOE_VLLM_MAX_MODEL_LEN:-32768}"
MAX_LOGPROBS="${FLOE_VLLM_MAX_LOGPROBS:-20}"                # = FLOE_INFERENCE_MAX_LOGPROBS
TOOL_PARSER="${FLOE_VLLM_TOOL_PARSER:-hermes}"              # Qwen2.5/Qwen3 emit Hermes <tool_call>{json}</tool_call>
REASONING_PARSER="${FLOE_VLLM_REASONING_PARSER:-qwen3}"     # <think>...</think> -> reasoning_content
TP="${FLOE_VLLM_TENSOR_PARALLEL:-1}"
GPU_UTIL="${FLOE_VLLM_GPU_MEMORY_UTILIZATION:-0.90}"

args=(
  serve "$MODEL"
  --served-model-name "$SERVED_NAME"
  --host "$HOST"
  --port "$PORT"
  --max-model-len "$MAX_MODEL_LEN"
  --tensor-parallel-size "$TP"
  --gpu-memory-utilization "$GPU_UTIL"
  --dtype bfloat16
  # Tools and reasoning parsed server-side, exactly like the CPU engine does.
  --enable-auto-tool-choice
  --tool-call-parser "$TOOL_PARSER"
  --reasoning-parser "$REASONING_PARSER"
  # Logprobs: raw model distribution (what a teacher-forced pass recomputes), up to MAX_LOGPROBS alternatives.
  --max-logprobs "$MAX_LOGPROBS"
  --logprobs-mode raw_logprobs
  # Sampling defaults must be the API's (temperature 1, top_p 1), not the checkpoint's generation_config.json.
  --generation-config vllm
  --enable-prefix-caching
)

if [[ "${FLOE_VLLM_DRY_RUN:-0}" == "1" ]]; then
  printf '%s\n' vllm "${args[@]}"
  exit 0
fi
# Dev mode exposes /pause, /resume, /collective_rpc and /reset_prefix_cache, which the weight reload uses.
# Keep this port on a private network: those endpoints are administrative.
export VLLM_SERVER_DEV_MODE="${VLLM_SERVER_DEV_MODE:-1}"
exec vllm "${args[@]}"
