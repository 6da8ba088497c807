#!/usr/bin/env bash
# floe's vLLM profile: the `vllm serve` command line that speaks the same token-level API as services/inference
# (see deploy/vllm/README.md), on GPU and on CPU alike. Every knob is an env var with the default floe expects;
# FLOE_VLLM_DRY_RUN=1 prints the command (one argument per line) instead of running it.
#
# Device (FLOE_VLLM_DEVICE=auto|cpu|cuda; auto = cuda when nvidia-smi sees a GPU): only these flags differ.
#   cuda  --dtype bfloat16 --tensor-parallel-size --gpu-memory-utilization; max-model-len 32768
#   cpu   VLLM_TARGET_DEVICE=cpu, VLLM_CPU_KVCACHE_SPACE (GiB); --dtype float32 (bf16 is several times slower on
#         AVX2 CPUs) --enforce-eager (compiling takes minutes at every start and is no faster); max-model-len 2048
# The vllm binary: FLOE_VLLM_BIN, else `vllm` on PATH (the vllm/vllm-openai image), else the venv deploy/vllm/venv.sh
# builds (`make vllm`).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

DEVICE="${FLOE_VLLM_DEVICE:-auto}"
if [[ "$DEVICE" == auto ]]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then DEVICE=cuda; else DEVICE=cpu; fi
fi
MODEL="${FLOE_VLLM_MODEL:-/checkpoints/current}"            # a symlink the reload script re-points (README §weights)
SERVED_NAME="${FLOE_VLLM_SERVED_MODEL_NAME:-policy}"        # = FLOE_INFERENCE_SERVED_MODEL_NAME
HOST="${FLOE_VLLM_HOST:-0.0.0.0}"
PORT="${FLOE_VLLM_PORT:-8100}"                              # = FLOE_INFERENCE_PORT
MAX_LOGPROBS="${FLOE_VLLM_MAX_LOGPROBS:-20}"                # = FLOE_INFERENCE_MAX_LOGPROBS
TOOL_PARSER="${FLOE_VLLM_TOOL_PARSER:-hermes}"              # Hermes <tool_call>{json}</tool_call>, parsed as text
# <think>...</think> -> reasoning_content. vLLM refuses to start a reasoning parser whose tags are not single tokens
# of the model's vocabulary (SmolLM2 has none), so `auto` picks qwen3 only if the tokenizer has a <think> token (or
# when the model directory is not readable here, e.g. a dry run for another machine); `none` turns it off.
REASONING_PARSER="${FLOE_VLLM_REASONING_PARSER:-auto}"
if [[ "$REASONING_PARSER" == auto ]]; then
  REASONING_PARSER=qwen3
  if [[ -f "$MODEL/tokenizer.json" ]] && ! grep -q '"content": *"<think>"' "$MODEL/tokenizer.json"; then
    REASONING_PARSER=none
  fi
fi

args=(
  serve "$MODEL"
  --served-model-name "$SERVED_NAME"
  --host "$HOST"
  --port "$PORT"
  # Tools parsed server-side, exactly like the CPU engine does.
  --enable-auto-tool-choice
  --tool-call-parser "$TOOL_PARSER"
  # Logprobs: raw model distribution (what a teacher-forced pass recomputes), up to MAX_LOGPROBS alternatives.
  --max-logprobs "$MAX_LOGPROBS"
  --logprobs-mode raw_logprobs
  # Sampling defaults must be the API's (temperature 1, top_p 1), not the checkpoint's generation_config.json.
  --generation-config vllm
  --enable-prefix-caching
  # vLLM 0.32's CPU build does not re-pack a tied lm_head on reload_weights; this (from $HERE) does. A no-op on GPUs.
  --worker-extension-cls floe_cpu_reload.FloeCpuReload
)
[[ "$REASONING_PARSER" == none ]] || args+=(--reasoning-parser "$REASONING_PARSER")

case "$DEVICE" in
  cuda)
    args+=(
      --max-model-len "${FLOE_VLLM_MAX_MODEL_LEN:-32768}"
      --tensor-parallel-size "${FLOE_VLLM_TENSOR_PARALLEL:-1}"
      --gpu-memory-utilization "${FLOE_VLLM_GPU_MEMORY_UTILIZATION:-0.90}"
      --dtype "${FLOE_VLLM_DTYPE:-bfloat16}"
    )
    ;;
  cpu)
    export VLLM_TARGET_DEVICE=cpu
    export VLLM_CPU_KVCACHE_SPACE="${FLOE_VLLM_CPU_KVCACHE_GIB:-2}"
    # vLLM reserves one core for its frontend by default; FLOE_VLLM_CPU_THREADS_BIND=0-1 gives the engine both.
    [[ -z "${FLOE_VLLM_CPU_THREADS_BIND:-}" ]] || export VLLM_CPU_OMP_THREADS_BIND="$FLOE_VLLM_CPU_THREADS_BIND"
    args+=(
      --max-model-len "${FLOE_VLLM_MAX_MODEL_LEN:-2048}"
      --dtype "${FLOE_VLLM_DTYPE:-float32}"
      --enforce-eager
    )
    ;;
  *) echo "serve.sh: FLOE_VLLM_DEVICE must be auto, cpu or cuda, not '$DEVICE'" >&2; exit 2 ;;
esac

if [[ "${FLOE_VLLM_DRY_RUN:-0}" == "1" ]]; then
  printf '%s\n' vllm "${args[@]}"
  exit 0
fi

VLLM="${FLOE_VLLM_BIN:-}"
if [[ -z "$VLLM" ]]; then
  if command -v vllm >/dev/null 2>&1; then
    VLLM=vllm
  else
    VLLM="$(FLOE_VLLM_DEVICE="$DEVICE" bash "$HERE/venv.sh" --path)/bin/vllm"
    if [[ ! -x "$VLLM" || ! -f "$(dirname "$(dirname "$VLLM")")/.floe-complete" ]]; then
      echo "serve.sh: no vllm (not on PATH, FLOE_VLLM_BIN unset, no venv at ${VLLM%/bin/vllm}); build it: make vllm" >&2
      exit 2
    fi
  fi
fi
[[ -f "$MODEL/config.json" ]] || { echo "serve.sh: no checkpoint at $MODEL (config.json missing)" >&2; exit 2; }
# Dev mode exposes /pause, /resume, /collective_rpc and /reset_prefix_cache, which the weight reload uses.
# Keep this port on a private network: those endpoints are administrative.
export VLLM_SERVER_DEV_MODE="${VLLM_SERVER_DEV_MODE:-1}"
export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}"   # floe_cpu_reload.py, for --worker-extension-cls
exec "$VLLM" "${args[@]}"
