#!/usr/bin/env bash
# A Docker engine for machines where nothing runs one (no systemd, CI containers): start dockerd by hand, and stop it
# leaving the host as it was found.
#
#   dockerd.sh start [--state-dir DIR]   start dockerd unless an engine already answers; wait until it does
#   dockerd.sh stop  [--state-dir DIR]   stop the dockerd this script started (and only that one), then undo what
#                                        it changed: ip_forward, the iptables rules and policies, the docker0 bridge
#   dockerd.sh status                    "running" (exit 0) or "stopped" (exit 3)
#
# State (default <repo>/.floe/dockerd): the pid of the dockerd we started, its log, and a snapshot of the host's
# network settings taken before it started. `stop` is a no-op when `start` found an engine already running, so a
# developer's own Docker is never touched. Images stay in dockerd's data root (/var/lib/docker): they are the build
# cache that makes the next run warm.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
STATE="${FLOE_DOCKERD_STATE_DIR:-$REPO/.floe/dockerd}"
TIMEOUT="${FLOE_DOCKERD_TIMEOUT:-60}"

die() { echo "dockerd.sh: error: $*" >&2; exit 1; }
info() { echo "dockerd.sh: $*" >&2; }

CMD="${1:-}"
[[ -n "$CMD" ]] || { sed -n '2,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 2; }
shift
while [[ $# -gt 0 ]]; do
  case "$1" in
    --state-dir) STATE="$2"; shift 2 ;;
    *) die "unknown option '$1'" ;;
  esac
done
PIDFILE="$STATE/dockerd.pid"

# The engine answers when `docker version` reaches the server (the CLI may be newer than the engine).
answers() { docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

our_pid() {  # the pid of the dockerd we started, if it is still that process
  [[ -f "$PIDFILE" ]] || return 0
  local pid
  pid="$(cat "$PIDFILE")"
  [[ "$pid" =~ ^[0-9]+$ && -r "/proc/$pid/cmdline" ]] || return 0
  # Read whole, not piped into `grep -q`: under pipefail, grep exiting first fails the pipe (SIGPIPE) at random.
  local cmdline
  cmdline="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)"
  [[ "$cmdline" == *dockerd* ]] && echo "$pid"
  return 0
}

snapshot() {  # what dockerd changes on the host, recorded before it starts
  mkdir -p "$STATE"
  cat /proc/sys/net/ipv4/ip_forward >"$STATE/ip_forward"
  if command -v iptables-save >/dev/null; then iptables-save >"$STATE/iptables.v4" 2>/dev/null || rm -f "$STATE/iptables.v4"; fi
  if ip link show docker0 >/dev/null 2>&1; then echo yes >"$STATE/docker0"; else echo no >"$STATE/docker0"; fi
  for f in /proc/sys/net/bridge/bridge-nf-call-iptables /proc/sys/net/bridge/bridge-nf-call-ip6tables; do
    [[ -r "$f" ]] && echo "$f $(cat "$f")" >>"$STATE/sysctl"
  done
  return 0
}

restore() {
  [[ -f "$STATE/ip_forward" ]] && cat "$STATE/ip_forward" >/proc/sys/net/ipv4/ip_forward
  if [[ -f "$STATE/iptables.v4" ]]; then
    # The snapshot has every table that had rules or policies: restoring it removes docker's chains and rules there
    # and puts back the FORWARD policy (dockerd sets it to DROP). A table missing from it was empty, with ACCEPT
    # policies: reset it to that.
    iptables-restore <"$STATE/iptables.v4" || info "could not restore iptables (left as dockerd left them)"
    local table chain
    for table in filter nat mangle raw; do
      grep -q "^\*$table\$" "$STATE/iptables.v4" && continue
      iptables -t "$table" -S >/dev/null 2>&1 || continue
      iptables -t "$table" -F && iptables -t "$table" -X || info "could not reset iptables table $table"
      for chain in $(iptables -t "$table" -S | awk '$1=="-P"{print $2}'); do iptables -t "$table" -P "$chain" ACCEPT; done
    done
  fi
  if [[ "$(cat "$STATE/docker0" 2>/dev/null)" == no ]] && ip link show docker0 >/dev/null 2>&1; then
    ip link delete docker0 || info "could not remove docker0"
  fi
  if [[ -f "$STATE/sysctl" ]]; then
    while read -r f v; do [[ -w "$f" ]] && echo "$v" >"$f"; done <"$STATE/sysctl"
  fi
  rm -f "$STATE/ip_forward" "$STATE/iptables.v4" "$STATE/docker0" "$STATE/sysctl"
}

cmd_start() {
  if answers; then
    info "an engine is already running: using it (and leaving it running)"
    return 0
  fi
  [[ -n "$(our_pid)" ]] && die "our dockerd (pid $(our_pid)) runs but does not answer; see $STATE/dockerd.log"
  command -v dockerd >/dev/null || die "no dockerd: install the engine (Debian: apt-get install -y docker.io docker-compose)"
  [[ "$(id -u)" == 0 ]] || die "starting dockerd needs root"
  snapshot
  setsid dockerd --pidfile "$STATE/dockerd.os.pid" >"$STATE/dockerd.log" 2>&1 </dev/null &
  local launched=$!
  echo "$launched" >"$PIDFILE"
  local deadline=$((SECONDS + TIMEOUT))
  while ((SECONDS < deadline)); do
    if answers; then info "dockerd started (pid $launched)"; return 0; fi
    # Liveness by signal 0, not by our_pid's cmdline check: while the child execs (shell, setsid, dockerd: one pid
    # throughout) its cmdline can read empty for an instant.
    if ! kill -0 "$launched" 2>/dev/null; then
      tail -n 20 "$STATE/dockerd.log" >&2
      restore
      die "dockerd exited during start-up (log above)"
    fi
    sleep 0.5
  done
  tail -n 20 "$STATE/dockerd.log" >&2
  cmd_stop
  die "dockerd did not answer within ${TIMEOUT}s"
}

cmd_stop() {
  local pid
  pid="$(our_pid)"
  if [[ -z "$pid" ]]; then
    rm -f "$PIDFILE"
    [[ -f "$STATE/ip_forward" ]] && restore
    return 0
  fi
  kill -TERM "$pid" 2>/dev/null || true
  # dockerd stops its containers (10 s each at most) and its containerd before it exits.
  for _ in $(seq 1 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    info "dockerd did not stop within 60 s: SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    sleep 0.5
  fi
  rm -f "$PIDFILE"
  restore
  info "dockerd stopped; host network settings restored"
}

case "$CMD" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) if answers; then echo running; else echo stopped; exit 3; fi ;;
  *) die "unknown command '$CMD'" ;;
esac
