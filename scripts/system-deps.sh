#!/usr/bin/env bash
# Debian packages floe needs at run time. Idempotent: installs only what is missing.
set -euo pipefail
need=()
command -v git >/dev/null || need+=(git)
command -v bwrap >/dev/null || need+=(bubblewrap)
command -v java >/dev/null || need+=(openjdk-17-jre-headless)
command -v mvn >/dev/null || need+=(maven)
command -v prlimit >/dev/null || need+=(util-linux)
# `--test`: also what the test suite needs (headless Chromium for the dashboard test; a Docker engine, compose and
# debootstrap for the compose test, which builds its images from a local base: tests/e2e/test_compose_up.py).
if [ "${1:-}" = "--test" ]; then
  command -v chromium >/dev/null || need+=(chromium)
  if ! docker version >/dev/null 2>&1; then
    command -v dockerd >/dev/null || need+=(docker.io)
  fi
  docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null || need+=(docker-compose)
  command -v debootstrap >/dev/null || need+=(debootstrap)
fi
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] && ! command -v sudo >/dev/null; then
  echo "floe: missing system packages: ${need[*]}; install them (Debian/Ubuntu: apt-get install ${need[*]})" >&2
  exit 1
fi
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
echo "floe: installing system packages: ${need[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
