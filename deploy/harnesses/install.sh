#!/usr/bin/env bash
# Install the agent CLIs that floe's harness presets run, into one cache prefix.
#
#   deploy/harnesses/install.sh            # all harnesses
#   deploy/harnesses/install.sh pi codex   # a subset (names as in services/sessions/presets/)
#
# Layout (FLOE_HARNESS_HOME, default ${FLOE_CACHE}/harnesses; FLOE_CACHE defaults to /var/cache/floe for root
# and ~/.cache/floe otherwise: the sandbox's unprivileged uid must traverse the path, and /root is mode 0700):
#   npm/            one npm prefix for the JS CLIs: npm/bin/{codex,claude,qwen,pi,gemini,opencode}
#   mini-swe-agent/ a Python venv with mini-swe-agent: mini-swe-agent/bin/mini
#   versions.txt    what was installed (the presets name these versions)
# Idempotent: a CLI whose pinned version is already installed is skipped, so a cached run takes well under a
# second. Needs node >= 20 and npm (the Makefile's `harnesses` target), python3 with venv for mini-swe-agent.
# The sandbox mounts this directory read-only at /opt/floe/harnesses; nothing is installed per session.
set -euo pipefail

if [ "$(id -u)" = 0 ]; then DEFAULT_CACHE=/var/cache/floe; else DEFAULT_CACHE="$HOME/.cache/floe"; fi
PREFIX="${FLOE_HARNESS_HOME:-${FLOE_CACHE:-$DEFAULT_CACHE}/harnesses}"
# The venv's interpreter must exist inside the sandbox, which mounts /usr but hides /root and /home: prefer the
# system python over pyenv/uv shims.
if [ -x /usr/bin/python3 ]; then PYTHON="${FLOE_HARNESS_PYTHON:-/usr/bin/python3}"; else PYTHON="${FLOE_HARNESS_PYTHON:-python3}"; fi

# Pinned versions: the ones docs/harnesses.md ("Pinned versions") lists. Bump them together with the presets.
declare -A NPM_PKG=(
  [codex]="@openai/codex@0.171.0"
  [claude-code]="@anthropic-ai/claude-code@2.1.197"
  [qwen-code]="@qwen-code/qwen-code@0.15.10"
  [pi]="@mariozechner/pi-coding-agent@0.73.1"
  [gemini-cli]="@google/gemini-cli@0.61.0"
  [opencode]="opencode-ai@latest"
)
declare -A NPM_BIN=(
  [codex]=codex [claude-code]=claude [qwen-code]=qwen [pi]=pi [gemini-cli]=gemini [opencode]=opencode
)
MINI_SWE_AGENT_SPEC="mini-swe-agent==2.4.6"
# The demo's toy agent (deploy/harnesses/toy_agent.py): a venv with the official openai SDK (preset toy, the demo's;
# preset toy-stdlib runs the same script with its standard-library client).
TOY_AGENT_SPEC="openai==3.57.0"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

log() { printf '[harnesses] %s\n' "$*" >&2; }

want=("$@")
if [ ${#want[@]} -eq 0 ]; then
  want=(codex claude-code qwen-code pi gemini-cli opencode mini-swe-agent toy-agent)
fi

mkdir -p "$PREFIX/npm"
chmod 755 "$(dirname "$PREFIX")"
# World-readable: the sandbox user (an unprivileged uid) executes these files.
chmod 755 "$PREFIX" "$PREFIX/npm"

installed_npm_version() {  # package name without version -> installed version or empty
  local pkg="$1" manifest="$PREFIX/npm/lib/node_modules/$1/package.json"
  # The first "version" key of an npm package.json is the package's own (no node start-up: this runs 12 times).
  [ -f "$manifest" ] && sed -n 's/^[[:space:]]*"version":[[:space:]]*"\([^"]*\)".*/\1/p' "$manifest" | head -n1 || true
}

changed=0
to_install=()
for name in "${want[@]}"; do
  if [ "$name" = "mini-swe-agent" ] || [ "$name" = "toy-agent" ]; then continue; fi
  spec="${NPM_PKG[$name]:-}"
  if [ -z "$spec" ]; then log "unknown harness: $name"; exit 2; fi
  pkg="${spec%@*}"; version="${spec##*@}"
  have="$(installed_npm_version "$pkg")"
  if [ -n "$have" ] && { [ "$version" = "latest" ] || [ "$have" = "$version" ]; } && [ -x "$PREFIX/npm/bin/${NPM_BIN[$name]}" ]; then
    log "$name $have already installed"
  else
    to_install+=("$spec")
  fi
done

if [ ${#to_install[@]} -gt 0 ]; then
  log "npm install ${to_install[*]}"
  # Optional dependencies carry the native Codex and Claude Code binaries: never --omit=optional.
  npm install --global --prefix "$PREFIX/npm" --no-fund --no-audit --loglevel=error "${to_install[@]}"
  changed=1
fi

for name in "${want[@]}"; do
  if [ "$name" != "mini-swe-agent" ]; then continue; fi
  venv="$PREFIX/mini-swe-agent"
  if [ -x "$venv/bin/mini" ] && "$venv/bin/python" -c 'import importlib.metadata as m, sys; sys.exit(m.version("mini-swe-agent") != sys.argv[1])' "${MINI_SWE_AGENT_SPEC##*==}" 2>/dev/null; then
    log "mini-swe-agent already installed"
  else
    log "pip install $MINI_SWE_AGENT_SPEC"
    "$PYTHON" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$MINI_SWE_AGENT_SPEC"
    changed=1
  fi
done

for name in "${want[@]}"; do
  if [ "$name" != "toy-agent" ]; then continue; fi
  venv="$PREFIX/toy-agent"
  if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import importlib.metadata as m, sys; sys.exit(m.version("openai") != sys.argv[1])' "${TOY_AGENT_SPEC##*==}" 2>/dev/null; then
    log "toy-agent already installed"
  else
    log "pip install $TOY_AGENT_SPEC (toy agent)"
    "$PYTHON" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$TOY_AGENT_SPEC"
    changed=1
  fi
  # The script is copied every time (cheap), so an edited toy_agent.py is picked up without a reinstall.
  { printf '#!%s\n' "$venv/bin/python"; tail -n +2 "$HERE/toy_agent.py"; } > "$venv/bin/floe-toy-agent.new"
  if ! cmp -s "$venv/bin/floe-toy-agent.new" "$venv/bin/floe-toy-agent" 2>/dev/null; then
    mv "$venv/bin/floe-toy-agent.new" "$venv/bin/floe-toy-agent"; changed=1
  else
    rm -f "$venv/bin/floe-toy-agent.new"
  fi
  chmod 755 "$venv/bin/floe-toy-agent"
done
if [ "$changed" = 1 ]; then chmod -R a+rX "$PREFIX"; fi
{
  for name in codex claude-code qwen-code pi gemini-cli opencode; do
    spec="${NPM_PKG[$name]}"; have="$(installed_npm_version "${spec%@*}")"
    if [ -n "$have" ]; then printf '%s %s\n' "$name" "$have"; fi
  done
  if [ -x "$PREFIX/toy-agent/bin/python" ]; then
    printf 'toy-agent openai-%s\n' "$("$PREFIX/toy-agent/bin/python" -c 'import importlib.metadata as m; print(m.version("openai"))')"
  fi
  if [ -x "$PREFIX/mini-swe-agent/bin/python" ]; then
    printf 'mini-swe-agent %s\n' "$("$PREFIX/mini-swe-agent/bin/python" -c 'import importlib.metadata as m; print(m.version("mini-swe-agent"))')"
  fi
} > "$PREFIX/versions.txt"
log "done: $PREFIX"
cat "$PREFIX/versions.txt" >&2
