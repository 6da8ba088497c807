#!/usr/bin/env bash
# Healthy when the broker answers a Kafka ApiVersions request on localhost:9092 (it answers only once request
# processing is on, after start-up). Bytes, not a JVM: a JVM start per check would cost a second of CPU every 5 s.
set -euo pipefail
port="${1:-9092}"
exec 3<>"/dev/tcp/127.0.0.1/$port"
# size 12 | api_key 18 (ApiVersions) | version 0 | correlation id 1 | client id "hc"
printf '\x00\x00\x00\x0c\x00\x12\x00\x00\x00\x00\x00\x01\x00\x02hc' >&3
# The reply starts with its size, then correlation id 1, then error code 0.
reply="$(timeout 4 head -c 10 <&3 | od -An -tx1 | tr -d ' \n')"
[[ "${reply:8:12}" == "000000010000" ]]
