#!/usr/bin/env bash
# Entrypoint of the images that run bubblewrap sandboxes (gateway node, scorer): make a fresh /proc mountable inside a
# sandbox's user namespace, then run the command without CAP_SYS_ADMIN.
#
# Docker masks parts of a container's /proc (files under /dev/null or tmpfs, /proc/sys and others re-mounted
# read-only). While any of those over-mounts exist the kernel refuses a new procfs in a user namespace ("too
# revealing"), so bubblewrap's --proc fails with "Can't mount proc on /proc: Operation not permitted". `docker run
# --security-opt systempaths=unconfined` lifts the masks, but compose 1.29 cannot pass it, and --privileged is both
# broader and refused on hosts whose capability bounding set is smaller than Docker's full set. So the container gets
# CAP_SYS_ADMIN (compose: cap_add), this script unmounts the masks, and the service itself runs with SYS_ADMIN
# dropped from every capability set (setpriv). Consequence, as with systempaths=unconfined: root in this container
# (the service, never agent code, which runs as an unprivileged uid in its own user namespace with a private /proc)
# sees /proc unmasked.
set -euo pipefail

has_sys_admin() {  # bit 21 of the effective capability set
  local eff
  eff="$(awk '/^CapEff:/{print $2}' /proc/self/status)"
  (( (16#$eff >> 21) & 1 ))
}

masks() { awk '$5 ~ "^/proc/" {print $5}' /proc/self/mountinfo | sort -r; }

if [[ -n "$(masks)" ]]; then
  if has_sys_admin; then
    for m in $(masks); do umount "$m" 2>/dev/null || umount -l "$m"; done
  else
    echo "sandbox-entrypoint: warning: /proc is masked and this container lacks CAP_SYS_ADMIN to unmask it;" \
      "sandboxes will fail to mount /proc (run with --cap-add SYS_ADMIN, or --security-opt systempaths=unconfined)" >&2
  fi
fi
if has_sys_admin; then
  exec setpriv --bounding-set=-sys_admin --inh-caps=-sys_admin -- "$@"
fi
exec "$@"
