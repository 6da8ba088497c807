#!/usr/bin/env bash
# A local base image for machines that cannot pull from a registry: Debian trixie (what python:3.11-slim is built on)
# made with debootstrap from the host's Debian mirror, with Python 3, pip, venv and the host's CA certificates.
#
#   deploy/docker/base-image.sh [NAME]     default NAME: floe/base:local; prints NAME
#
# Every floe Dockerfile takes `ARG BASE_IMAGE` (default: the public image users expect); build them from this one
# with `--build-arg BASE_IMAGE=floe/base:local` (deploy/docker/compose-local.sh does). Idempotent: the image is
# labelled with a hash of this script and of the host's extra CA certificates, and rebuilt only when they change.
#
# Why the certificates: on machines behind a TLS-intercepting proxy, HTTPS from inside a build (pip, uv, npm) fails
# unless the proxy's CA is trusted. The host's extra CAs (/usr/local/share/ca-certificates/*.crt; there may be none)
# are added to the image's bundle, and SSL_CERT_FILE / PIP_CERT / REQUESTS_CA_BUNDLE / NODE_EXTRA_CA_CERTS point at it.
# Debian's Python is "externally managed" (PEP 668); PIP_BREAK_SYSTEM_PACKAGES=1 lets a Dockerfile's
# `pip install uv` work as it does on python:3.11-slim. The image's Python is Debian trixie's (3.13).
set -euo pipefail

NAME="${1:-floe/base:local}"
SUITE="${FLOE_BASE_SUITE:-trixie}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
info() { echo "base-image.sh: $*" >&2; }

hash="$( { cat "${BASH_SOURCE[0]}"; echo "$SUITE"; cat /usr/local/share/ca-certificates/*.crt 2>/dev/null || true; } | sha256sum | cut -c1-16)"
if [[ "$(docker image inspect --format '{{ index .Config.Labels "floe.base.hash" }}' "$NAME" 2>/dev/null || true)" == "$hash" ]]; then
  echo "$NAME"
  exit 0
fi

command -v debootstrap >/dev/null || { echo "base-image.sh: error: debootstrap is missing (Debian: apt-get install -y debootstrap)" >&2; exit 1; }
MIRROR="${FLOE_DEBIAN_MIRROR:-}"
if [[ -z "$MIRROR" ]]; then
  MIRROR="$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)"
fi
if [[ -z "$MIRROR" ]]; then
  MIRROR="$(awk '$1=="deb"{print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)"
fi
MIRROR="${MIRROR:-http://deb.debian.org/debian}"

root="$(mktemp -d /var/tmp/floe-base.XXXXXX)"
trap 'rm -rf "$root"' EXIT
info "debootstrap $SUITE from $MIRROR (about a minute)"
debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,python-is-python3,ca-certificates \
  "$SUITE" "$root" "$MIRROR" >"$root.log" 2>&1 || { tail -n 20 "$root.log" >&2; rm -f "$root.log"; exit 1; }
rm -f "$root.log"
echo "deb $MIRROR $SUITE main" >"$root/etc/apt/sources.list"
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
  chroot "$root" update-ca-certificates >/dev/null
fi
# What a container never needs: package caches, docs, man pages, locales.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* \
  "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/* "$root"/var/log/*.log
# Some packages' maintainer scripts (Java's) fail when the man page directories they link into are gone.
mkdir -p "$root"/usr/share/man/man1
bundle=/etc/ssl/certs/ca-certificates.crt
tar -C "$root" -c . | docker import \
  --change "ENV LANG=C.UTF-8 PIP_BREAK_SYSTEM_PACKAGES=1 SSL_CERT_FILE=$bundle PIP_CERT=$bundle REQUESTS_CA_BUNDLE=$bundle NODE_EXTRA_CA_CERTS=$bundle" \
  --change "LABEL floe.base.hash=$hash floe.base.suite=$SUITE" \
  --change 'CMD ["/bin/bash"]' - "$NAME" >/dev/null
info "$NAME: $(docker image inspect --format '{{.Size}}' "$NAME" | awk '{printf "%.0f MB", $1/1e6}')"
echo "$NAME"
