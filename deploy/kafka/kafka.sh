#!/usr/bin/env bash
# floe's single-node Apache Kafka 4.x broker (KRaft broker+controller; clients on 127.0.0.1 or --host), from Maven
# Central jars.
#
#   kafka.sh jars                      resolve the broker jars into deploy/kafka/lib/ (Maven; ~/.m2 is the cache)
#   kafka.sh start  [options]          format (first time) + start in the background + wait until ready; idempotent
#   kafka.sh stop   [options]          SIGTERM the recorded pid, SIGKILL it after the deadline; idempotent
#   kafka.sh status [options]          "running pid=… address=…" (exit 0) or "stopped" (exit 3)
#   kafka.sh wait-ready [options]      wait until the broker answers (or fail with the log tail)
#   kafka.sh logs   [options] [-f]     print (or follow) the broker log
#
# Options (or environment):
#   --state-dir DIR        FLOE_KAFKA_STATE_DIR   default <repo>/.floe/kafka; holds server.properties, data/, the
#                                                 pid file, broker.log (broker.log.1: the run before) and the
#                                                 broker address
#   --port N               FLOE_KAFKA_PORT        client (PLAINTEXT) port, default 9092
#   --controller-port N    FLOE_KAFKA_CONTROLLER_PORT   default 9093 (always on 127.0.0.1: only the broker uses it)
#   --host ADDR            FLOE_KAFKA_HOST        the address clients reach (listened on and advertised), default
#                                                 127.0.0.1 (a restart keeps the last one); the multi-host tests run start in a network namespace
#                                                 (`ip netns exec NS kafka.sh start --host 10.x.y.z`)
#   --timeout S            FLOE_KAFKA_READY_TIMEOUT     readiness deadline in seconds, default 60
#   --owner-pid PID        stop the broker when PID exits (the test plugin passes its own pid, so a killed
#                          pytest never leaves a broker behind)
#   FLOE_KAFKA_HEAP (default 512m), FLOE_KAFKA_JVM_OPTS (extra JVM flags), FLOE_KAFKA_STOP_TIMEOUT (default 30),
#   FLOE_KAFKA_EXTRA_PROPS (broker settings appended to server.properties, one key=value per line),
#   FLOE_KAFKA_FAST_START (default 1: C1 JIT + a class-data-sharing archive kept in lib/; 0: stock JVM flags),
#   FLOE_JAVA (the java binary; default $JAVA_HOME/bin/java if JAVA_HOME is set, else java on PATH)
#
# Limits: a state dir remembers the ports it was formatted with (the KRaft voter record stores the controller
# endpoint), so a different port needs a fresh state dir. Processes are only ever signalled by the pid recorded in
# the state dir, after checking that pid's command line names that state dir: never by name.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
LIB="$HERE/lib"
CONF="$HERE/conf"
CDS="$LIB/kafka-cds.jsa"  # lives with the jars: `jars` re-resolving them deletes it too

JAVA="${FLOE_JAVA:-${JAVA_HOME:+$JAVA_HOME/bin/java}}"
JAVA="${JAVA:-java}"

die() { echo "kafka.sh: error: $*" >&2; exit 1; }
info() { echo "kafka.sh: $*" >&2; }

usage() { sed -n '2,28p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

CMD="${1:-}"
[[ -n "$CMD" ]] || { usage; exit 2; }
shift

STATE="${FLOE_KAFKA_STATE_DIR:-$REPO/.floe/kafka}"
PORT="${FLOE_KAFKA_PORT:-}"
CPORT="${FLOE_KAFKA_CONTROLLER_PORT:-}"
HOST="${FLOE_KAFKA_HOST:-}"  # empty: what the state dir was started with, else 127.0.0.1
TIMEOUT="${FLOE_KAFKA_READY_TIMEOUT:-60}"
STOP_TIMEOUT="${FLOE_KAFKA_STOP_TIMEOUT:-30}"
HEAP="${FLOE_KAFKA_HEAP:-512m}"
OWNER_PID=""
FOLLOW=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --state-dir) STATE="$2"; shift 2 ;;
    --port) PORT="$2"; shift 2 ;;
    --controller-port) CPORT="$2"; shift 2 ;;
    --host) HOST="$2"; shift 2 ;;
    --timeout) TIMEOUT="$2"; shift 2 ;;
    --owner-pid) OWNER_PID="$2"; shift 2 ;;
    -f|--follow) FOLLOW=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown option '$1' (see: kafka.sh --help)" ;;
  esac
done
# Only `start` creates the state dir; the other commands must not leave empty ones behind.
[[ "$CMD" == "start" ]] && mkdir -p "$STATE"
if [[ -d "$STATE" ]]; then STATE="$(cd "$STATE" && pwd)"; fi
PIDFILE="$STATE/kafka.pid"
WATCHDOGFILE="$STATE/watchdog.pid"
LOG="$STATE/broker.log"
PROPS="$STATE/server.properties"
ADDRFILE="$STATE/address"
PORTSFILE="$STATE/ports"

# ----------------------------------------------------------------------------------------------- prerequisites

need_java() {
  command -v "$JAVA" >/dev/null 2>&1 || die "java not found ($JAVA): install a Java 17+ runtime (Debian: apt-get install -y openjdk-17-jre-headless) or set JAVA_HOME"
  local v
  v="$("$JAVA" -version 2>&1 | sed -n 's/.*version "\([0-9][0-9]*\)[^"]*".*/\1/p' | head -n1)"
  [[ "$v" == "1" ]] && v=8
  [[ -n "$v" && "$v" -ge 17 ]] || die "Java 17+ is required by the Kafka 4.x broker, found: $("$JAVA" -version 2>&1 | head -n1) (Debian: apt-get install -y openjdk-17-jre-headless)"
}

need_jars() {
  compgen -G "$LIB/kafka_2.13-*.jar" >/dev/null \
    || die "Kafka jars missing in $LIB: run 'bash deploy/kafka/kafka.sh jars' (needs Maven: apt-get install -y maven)"
}

cmd_jars() {
  need_java
  if compgen -G "$LIB/kafka_2.13-*.jar" >/dev/null && [[ "$LIB" -nt "$HERE/pom.xml" ]]; then
    info "jars up to date in $LIB"
    return 0
  fi
  command -v mvn >/dev/null 2>&1 || die "mvn not found: install Maven to fetch the Kafka jars (Debian: apt-get install -y maven)"
  rm -rf "$LIB"
  mvn -q -B -f "$HERE/pom.xml" package || die "Maven could not resolve the Kafka jars (see the output above)"
  rm -rf "$HERE/target"
  compgen -G "$LIB/kafka_2.13-*.jar" >/dev/null || die "Maven finished but $LIB has no kafka_2.13 jar"
  touch "$LIB"
  info "jars in $LIB ($(ls "$LIB" | wc -l) files)"
}

# ------------------------------------------------------------------------------------------------ pid handling

# Prints the recorded pid if that process is alive AND is the broker of this state dir; else nothing.
live_pid() {
  [[ -f "$PIDFILE" ]] || return 0
  local pid
  pid="$(cat "$PIDFILE" 2>/dev/null || true)"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 0
  kill -0 "$pid" 2>/dev/null || return 0
  if [[ -r "/proc/$pid/cmdline" ]]; then
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$PROPS" || return 0
  fi
  echo "$pid"
}

# port_open PORT [ADDR]: something accepts connections there (ADDR defaults to 127.0.0.1).
port_open() { (exec 3<>"/dev/tcp/${2:-127.0.0.1}/$1") 2>/dev/null; }

free_port() {
  local p
  for _ in $(seq 1 50); do
    p=$(( (RANDOM % 20000) + 30000 ))
    port_open "$p" || port_open "$p" "$HOST" || { echo "$p"; return 0; }
  done
  die "could not find a free port"
}

# ------------------------------------------------------------------------------------------------------ start

write_props() {
  cp "$CONF/server.properties" "$PROPS"
  cat >>"$PROPS" <<EOF

# ---- per-instance keys written by kafka.sh (override the ones above)
controller.quorum.bootstrap.servers=127.0.0.1:$CPORT
listeners=PLAINTEXT://$HOST:$PORT,CONTROLLER://127.0.0.1:$CPORT
advertised.listeners=PLAINTEXT://$HOST:$PORT,CONTROLLER://127.0.0.1:$CPORT
log.dirs=$STATE/data
EOF
  if [[ -n "${FLOE_KAFKA_EXTRA_PROPS:-}" ]]; then
    printf '\n# ---- FLOE_KAFKA_EXTRA_PROPS\n%s\n' "$FLOE_KAFKA_EXTRA_PROPS" >>"$PROPS"
  fi
}

cluster_id() {
  # 16 random bytes as unpadded base64url (22 chars), as StorageTool random-uuid prints; Kafka rejects ids that
  # start with '-'. Saves a JVM start (~1 s).
  local id
  while :; do
    id="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')"
    [[ "$id" == -* ]] || { echo "$id"; return; }
  done
}

start_watchdog() {
  # A detached loop that stops the broker when the owner process exits (pytest killed by SIGKILL, say).
  local owner="$1" pid="$2"
  nohup bash -c '
    owner=$1; pid=$2; props=$3; deadline=$4
    while kill -0 "$owner" 2>/dev/null && kill -0 "$pid" 2>/dev/null; do sleep 1; done
    kill -0 "$pid" 2>/dev/null || exit 0
    tr "\0" " " <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$props" || exit 0
    kill -TERM "$pid" 2>/dev/null || exit 0
    for _ in $(seq 1 "$deadline"); do kill -0 "$pid" 2>/dev/null || exit 0; sleep 1; done
    kill -KILL "$pid" 2>/dev/null || true
  ' floe-kafka-watchdog "$owner" "$pid" "$PROPS" "$STOP_TIMEOUT" </dev/null >/dev/null 2>&1 &
  echo $! >"$WATCHDOGFILE"
}

stop_watchdog() {
  # The watchdog notices a stopped broker only at its next poll (up to 1 s later): end it now, so `stop` returns
  # with nothing of this state dir left running.
  [[ -f "$WATCHDOGFILE" ]] || return 0
  local pid
  pid="$(cat "$WATCHDOGFILE" 2>/dev/null || true)"
  rm -f "$WATCHDOGFILE"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 0
  [[ -r "/proc/$pid/cmdline" ]] || return 0
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "floe-kafka-watchdog" || return 0
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$PROPS" || return 0
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.05; done
  kill -KILL "$pid" 2>/dev/null || true
}

cmd_start() {
  local pid
  pid="$(live_pid)"
  if [[ -n "$pid" ]]; then
    info "already running (pid $pid)"
    cat "$ADDRFILE"
    return 0
  fi
  need_java
  need_jars
  # Ports: a formatted state dir keeps its ports (the voter record holds the controller endpoint).
  if [[ -f "$STATE/data/meta.properties" && -f "$PORTSFILE" ]]; then
    local old_port old_cport old_host
    read -r old_port old_cport old_host <"$PORTSFILE"
    if [[ -n "$PORT" && "$PORT" != "$old_port" ]] || [[ -n "$CPORT" && "$CPORT" != "$old_cport" ]]; then
      die "state dir $STATE was formatted for ports $old_port/$old_cport; use another --state-dir (or delete it) to change ports"
    fi
    PORT="$old_port"; CPORT="$old_cport"; HOST="${HOST:-${old_host:-127.0.0.1}}"
  else
    rm -rf "$STATE/data"
    HOST="${HOST:-127.0.0.1}"
    PORT="${PORT:-9092}"
    CPORT="${CPORT:-9093}"
    [[ "$PORT" == "0" ]] && PORT="$(free_port)"
    [[ "$CPORT" == "0" ]] && CPORT="$(free_port)"
  fi
  port_open "$PORT" "$HOST" && die "port $PORT is already in use (another broker?); pick another with --port or FLOE_KAFKA_PORT"
  port_open "$CPORT" && die "port $CPORT is already in use; pick another with --controller-port or FLOE_KAFKA_CONTROLLER_PORT"
  echo "$PORT $CPORT $HOST" >"$PORTSFILE"
  write_props
  mkdir -p "$STATE/tmp"

  local cp="$LIB/*"
  # zstd-jni / snappy unpack native code into java.io.tmpdir: use our own (executable) directory.
  local common=(-Djava.awt.headless=true "-Djava.io.tmpdir=$STATE/tmp" -cp "$cp")
  if [[ ! -f "$STATE/data/meta.properties" ]]; then
    "$JAVA" -Xmx256m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC "${common[@]}" \
      "-Dlog4j2.configurationFile=$CONF/tools-log4j2.properties" \
      kafka.tools.StorageTool format --standalone -t "$(cluster_id)" -c "$PROPS" >"$STATE/format.log" 2>&1 \
      || die "formatting $STATE/data failed: $(tail -n 5 "$STATE/format.log")"
  fi

  # The previous run's log (its shutdown above all: what a restart left behind is decided there) is kept as
  # broker.log.1; broker.log is this run's.
  if [[ -s "$LOG" ]]; then mv -f "$LOG" "$LOG.1"; fi
  : >"$LOG"
  # shellcheck disable=SC2086
  # Fast start (default): the C1 JIT only, plus an AppCDS archive of the broker's classes. On a busy 2-core
  # machine this cuts a warm start from ~12 s to ~3 s; C1 code is plenty for a development/test broker.
  # FLOE_KAFKA_FAST_START=0 gives the stock JVM flags.
  local fast=()
  rm -f "$STATE/cds.jsa"
  if [[ "${FLOE_KAFKA_FAST_START:-1}" != "0" ]]; then
    fast+=(-XX:TieredStopAtLevel=1)
    if [[ -f "$CDS" ]]; then
      fast+=("-XX:SharedArchiveFile=$CDS")
    else
      # No archive yet: this broker writes one when it exits cleanly; `stop` publishes it for the next starts.
      fast+=("-XX:ArchiveClassesAtExit=$STATE/cds.jsa")
    fi
  fi
  nohup "$JAVA" "-Xms$HEAP" "-Xmx$HEAP" -server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
    -XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent -XX:MaxInlineLevel=15 \
    "${fast[@]}" ${FLOE_KAFKA_JVM_OPTS:-} "${common[@]}" "-Dkafka.logs.dir=$STATE" \
    "-Dlog4j2.configurationFile=$CONF/log4j2.properties" \
    kafka.Kafka "$PROPS" </dev/null >>"$LOG" 2>&1 &
  pid=$!
  echo "$pid" >"$PIDFILE"
  echo "$HOST:$PORT" >"$ADDRFILE"
  [[ -n "$OWNER_PID" ]] && start_watchdog "$OWNER_PID" "$pid"
  if ! wait_ready "$pid"; then
    stop_pid "$pid"
    stop_watchdog
    rm -f "$PIDFILE"
    exit 1
  fi
  cat "$ADDRFILE"
}

# The broker is ready when it logged that it started and its client port accepts connections. The Python side
# (eventbus.testing, floe kafka up) additionally asks it for metadata.
wait_ready() {
  local pid="$1" deadline=$((SECONDS + TIMEOUT)) port
  port="$(cut -d' ' -f1 "$PORTSFILE")"
  while ((SECONDS < deadline)); do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "kafka.sh: error: the broker exited during startup; log $LOG ends with:" >&2
      tail -n 20 "$LOG" >&2
      return 1
    fi
    if grep -q "Kafka Server started" "$LOG" 2>/dev/null && port_open "$port" "$(cut -d: -f1 "$ADDRFILE")"; then
      return 0
    fi
    sleep 0.2
  done
  echo "kafka.sh: error: the broker was not ready after ${TIMEOUT}s; log $LOG ends with:" >&2
  tail -n 20 "$LOG" >&2
  return 1
}

cmd_wait_ready() {
  local pid
  pid="$(live_pid)"
  [[ -n "$pid" ]] || die "no broker running for state dir $STATE (start it with: kafka.sh start)"
  wait_ready "$pid" || exit 1
  cat "$ADDRFILE"
}

# ------------------------------------------------------------------------------------------------------- stop

# SIGTERM (controlled shutdown), SIGKILL after the deadline. Returns 0 after a clean exit, 1 if it had to SIGKILL.
stop_pid() {
  local pid="$1" deadline=$((SECONDS + STOP_TIMEOUT))
  kill -TERM "$pid" 2>/dev/null || return 0
  while ((SECONDS < deadline)); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  info "pid $pid still alive after ${STOP_TIMEOUT}s: SIGKILL"
  kill -KILL "$pid" 2>/dev/null || true
  while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  return 1
}

# After a clean exit, a class archive written by that broker becomes the shared one (atomic rename: concurrent
# starts see either no archive or a complete one).
publish_cds() {
  if [[ -s "$STATE/cds.jsa" && ! -f "$CDS" && -d "$LIB" ]]; then
    mv -f "$STATE/cds.jsa" "$CDS.tmp.$$" && mv -f "$CDS.tmp.$$" "$CDS" || rm -f "$CDS.tmp.$$"
  fi
  rm -f "$STATE/cds.jsa"
}

cmd_stop() {
  local pid
  pid="$(live_pid)"
  if [[ -z "$pid" ]]; then
    stop_watchdog
    rm -f "$PIDFILE"
    info "not running"
    return 0
  fi
  if stop_pid "$pid"; then
    publish_cds
  else
    rm -f "$STATE/cds.jsa"
  fi
  stop_watchdog
  rm -f "$PIDFILE"
  info "stopped (pid $pid)"
}

cmd_status() {
  local pid
  pid="$(live_pid)"
  if [[ -n "$pid" ]]; then
    echo "running pid=$pid address=$(cat "$ADDRFILE") state=$STATE"
  else
    echo "stopped state=$STATE"
    exit 3
  fi
}

cmd_logs() {
  [[ -f "$LOG" ]] || die "no broker log at $LOG"
  if ((FOLLOW)); then exec tail -n 50 -f "$LOG"; else cat "$LOG"; fi
}

case "$CMD" in
  jars) cmd_jars ;;
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  wait-ready) cmd_wait_ready ;;
  logs) cmd_logs ;;
  -h|--help|help) usage ;;
  *) die "unknown command '$CMD' (jars | start | stop | status | wait-ready | logs)" ;;
esac
