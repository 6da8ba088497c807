#!/usr/bin/env bash
# Hot-swap a running vLLM (started by serve.sh) to a learner checkpoint directory, in place, without a restart:
#   pause (drain in-flight requests) -> re-point the model symlink -> collective_rpc reload_weights
#   -> reset_prefix_cache (cached KV was computed by the old weights) -> resume.
# Usage: reload_weights.sh CHECKPOINT_DIR [VLLM_URL]
# Needs VLLM_SERVER_DEV_MODE=1 on the server; the checkpoint must have the same architecture and tokenizer.
# For a vLLM without floe's proxy in front: the proxy reloads from floe.weights itself (deploy/vllm/README.md).
set -euo pipefail
CKPT="$(realpath "${1:?usage: reload_weights.sh CHECKPOINT_DIR [VLLM_URL]}")"
URL="${2:-${FLOE_VLLM_URL:-http://127.0.0.1:8100}}"
LINK="${FLOE_VLLM_MODEL:-/checkpoints/current}"
post() { curl -fsS -X POST -H 'content-type: application/json' "$URL$1" ${2:+-d "$2"}; echo; }

[[ -f "$CKPT/config.json" ]] || { echo "not a checkpoint directory: $CKPT" >&2; exit 2; }
# `mode=wait` (recent vLLM) and `wait_for_inflight_requests=true` (older): drain on the old weights, hold new ones.
post "/pause?mode=wait&wait_for_inflight_requests=true&clear_cache=true"
trap 'post /resume' EXIT                      # never leave the server paused, even if the reload fails
ln -sfn "$CKPT" "$LINK.tmp" && mv -T "$LINK.tmp" "$LINK"   # atomic re-point
post /collective_rpc '{"method": "reload_weights"}'
post /reset_prefix_cache
# vLLM's record of what it holds: floe's proxy (`python -m inference --engine vllm`) watches it and restarts when it
# changes behind its back, rather than stamp calls with a version whose weights are gone.
post /update_weight_version "{\"new_version\": \"manual:$CKPT\"}"
