#!/usr/bin/env bash
# Start the broker in the foreground (PID 1: `docker stop` reaches the JVM) from /opt/kafka/config/server.properties
# plus every KAFKA_* environment variable, mapped as apache/kafka maps them: strip KAFKA_, lower-case, then
# "___" -> "-", "__" -> "_", "_" -> ".". Formats the data directory on first start (CLUSTER_ID, or a random id).
set -euo pipefail

CONF=/opt/kafka/config
PROPS=/tmp/server.properties
declare -A env_props=()
for name in $(compgen -e); do
  [[ "$name" == KAFKA_* ]] || continue
  case "$name" in KAFKA_HEAP_OPTS|KAFKA_OPTS|KAFKA_JVM_PERFORMANCE_OPTS) continue ;; esac
  key="${name#KAFKA_}"
  key="${key,,}"
  key="${key//___/-}"
  key="${key//__/@}"
  key="${key//_/.}"
  key="${key//@/_}"
  env_props["$key"]="${!name}"
done
[[ -n "${env_props[log.dirs]:-}" ]] || env_props[log.dirs]=/var/lib/kafka/data
# A static quorum (controller.quorum.voters, as apache/kafka's examples set) and our file's dynamic one cannot mix.
static=0
[[ -n "${env_props[controller.quorum.voters]:-}" ]] && static=1

{
  while IFS= read -r line; do
    key="${line%%=*}"
    [[ "$line" == \#* || -z "$line" ]] && { echo "$line"; continue; }
    [[ -n "${env_props[$key]+x}" ]] && continue
    [[ "$static" == 1 && "$key" == controller.quorum.bootstrap.servers ]] && continue
    echo "$line"
  done <"$CONF/server.properties"
  for key in "${!env_props[@]}"; do echo "$key=${env_props[$key]}"; done
} >"$PROPS"

DATA="${env_props[log.dirs]%%,*}"
mkdir -p "$DATA"
CP="/opt/kafka/libs/*"
if [[ ! -f "$DATA/meta.properties" ]]; then
  id="${CLUSTER_ID:-$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n' | sed 's/^-/A/')}"
  mode=(--standalone)
  [[ "$static" == 1 ]] && mode=()
  java -Xmx256m -XX:TieredStopAtLevel=1 -cp "$CP" "-Dlog4j2.configurationFile=$CONF/tools-log4j2.properties" \
    kafka.tools.StorageTool format "${mode[@]}" -t "$id" -c "$PROPS"
fi
# shellcheck disable=SC2086
exec java ${KAFKA_HEAP_OPTS:--Xms512m -Xmx512m} -server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
  -XX:TieredStopAtLevel=1 -Djava.awt.headless=true ${KAFKA_OPTS:-} -cp "$CP" \
  "-Dlog4j2.configurationFile=$CONF/log4j2.properties" kafka.Kafka "$PROPS"
