#!/usr/bin/env bash
# docker-compose.yml on a machine that cannot pull images (no registry, as on our CI machines): one command.
#
#   deploy/docker/compose-local.sh up            # build what is missing, start the cpu profile, follow the logs
#   deploy/docker/compose-local.sh up -d         # the same, detached
#   deploy/docker/compose-local.sh build         # (re)build the images only
#   deploy/docker/compose-local.sh down -v       # stop and remove the containers (and, with -v, the volumes)
#   deploy/docker/compose-local.sh ps|logs|...   # any other docker compose command, with the same settings
#
# What it does first: starts a Docker engine if none answers (deploy/docker/dockerd.sh; `dockerd.sh stop` undoes it),
# makes the local base image (deploy/docker/base-image.sh: Debian trixie by debootstrap from the host's mirror),
# resolves the Kafka jars and builds floe/kafka:local from them (deploy/kafka/Dockerfile), then runs compose with
#   FLOE_BASE_IMAGE=floe/base:local  FLOE_KAFKA_IMAGE=floe/kafka:local  FLOE_IMAGE_TAG=local
# Users with a registry need none of this: `docker compose --profile cpu up --build` uses the public images.
# Environment: FLOE_COMPOSE_PROFILE (default cpu), FLOE_HARNESSES (harness presets baked into the gateway image;
# default all), COMPOSE_PROJECT_NAME, and the FLOE_*_HOST_PORT variables of docker-compose.yml.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
cd "$REPO"
info() { echo "compose-local.sh: $*" >&2; }

[[ $# -gt 0 ]] || { sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 2; }

if docker compose version >/dev/null 2>&1; then
  COMPOSE=(docker compose)
elif command -v docker-compose >/dev/null; then
  COMPOSE=(docker-compose)
else
  echo "compose-local.sh: error: neither 'docker compose' nor docker-compose (Debian: apt-get install -y docker-compose)" >&2
  exit 1
fi

bash "$HERE/dockerd.sh" start
export FLOE_BASE_IMAGE="${FLOE_BASE_IMAGE:-floe/base:local}"
export FLOE_KAFKA_IMAGE="${FLOE_KAFKA_IMAGE:-floe/kafka:local}"
export FLOE_IMAGE_TAG="${FLOE_IMAGE_TAG:-local}"
export FLOE_KAFKA_HEALTHCHECK="${FLOE_KAFKA_HEALTHCHECK:-/opt/kafka/bin/health.sh}"
PROFILE="${FLOE_COMPOSE_PROFILE:-cpu}"

case "$1" in
  up|build|create|run)
    if [[ "$FLOE_BASE_IMAGE" == floe/base:local ]]; then
      bash "$HERE/base-image.sh" "$FLOE_BASE_IMAGE" >/dev/null
    fi
    if [[ "$FLOE_KAFKA_IMAGE" == floe/kafka:local ]]; then
      bash deploy/kafka/kafka.sh jars >/dev/null
      info "building $FLOE_KAFKA_IMAGE"
      docker build -q -t "$FLOE_KAFKA_IMAGE" --build-arg "BASE_IMAGE=$FLOE_BASE_IMAGE" deploy/kafka >/dev/null
    fi
    ;;
esac

if [[ "$1" == up ]]; then
  shift
  # Build first (cached layers make this quick when nothing changed), then start without pulling anything.
  "${COMPOSE[@]}" --profile "$PROFILE" build
  exec "${COMPOSE[@]}" --profile "$PROFILE" up --no-build "$@"
fi
exec "${COMPOSE[@]}" --profile "$PROFILE" "$@"
