# In-sandbox launcher for sandboxes without a bridge: watches the caller's lifeline, then execs the command.
# Run by the sandbox's bash (``bash -p``: no BASH_ENV, no functions or SHELLOPTS from the environment, which is the
# sandboxed program's). It starts in about a millisecond, where the Python launcher (sandbox_init.py, still used when
# the sandbox needs its TCP bridge) costs ~20 ms per sandbox. bash, not sh: dash cannot redirect a descriptor >= 10.
#
# Usage: bash -p sandbox_init.sh LIFELINE_FD [--unset-shlvl] -- argv...
#
# Before the exec it forks one helper that blocks on the read end of the lifeline (a pipe whose write end only the
# caller holds). EOF means the caller is done with the sandbox or died, and the helper then SIGKILLs every other
# process of the sandbox (kill -1 reaches exactly the processes of this pid namespace but its init and itself). It
# needs no parent-death signal: when the command exits, bwrap's init (pid 1 here) exits and the kernel kills
# whatever is left in the namespace, the helper included. Its stdin/stdout/stderr are not the command's, so it never
# keeps the caller's pipes open.
#
# --unset-shlvl: the spec's environment has no SHLVL. bash's exec always exports one (SHLVL=0 when there was none),
# so the command goes through env(1) to be started with exactly the spec's environment.
usage() {
  echo "sandbox_init.sh: usage: LIFELINE_FD [--unset-shlvl] -- argv..." >&2
  exit 127
}
fd=$1
case $fd in '' | *[!0-9]*) usage ;; esac
shift
unset_shlvl=
if [ "$1" = --unset-shlvl ]; then
  unset_shlvl=1
  shift
fi
if [ "$1" != "--" ] || [ $# -lt 2 ]; then usage; fi
shift
(
  eval "exec <&$fd $fd<&-"
  while read -r _; do :; done # the caller never writes; only EOF matters
  # Only inside bwrap's pid namespace (its init is bwrap): anywhere else kill -1 would reach the host's processes.
  read -r init </proc/1/comm
  if [ "$init" = bwrap ]; then kill -s KILL -1; fi
) </dev/null >/dev/null 2>&1 &
eval "exec $fd<&-"
if [ -n "$unset_shlvl" ]; then exec /usr/bin/env -u SHLVL -- "$@"; fi
exec "$@"
