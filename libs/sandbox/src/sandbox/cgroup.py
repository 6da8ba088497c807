"""Per-sandbox memory and process-count limits through a cgroup, where the machine has the controllers.

One cgroup per sandbox, created by ``Cgroup.create`` before the sandbox starts and removed after it ended:

- **cgroup v2** when a cgroup2 hierarchy offers both ``memory`` and ``pids`` to the caller's cgroup: one directory
  with ``memory.max``, ``memory.swap.max=0`` (no escape into swap) and ``pids.max``;
- else **cgroup v1**: a directory in the ``memory`` hierarchy (``memory.limit_in_bytes``, and
  ``memory.memsw.limit_in_bytes`` at the same value where swap accounting exists, so swap is no way round it) and
  one in the ``pids`` hierarchy (``pids.max``).

Where: ``<the caller's own cgroup>/floe/sbx-<caller pid>-<n>`` in each hierarchy. Under the caller's cgroup, not
the hierarchy's root, so that a limit the service itself runs under (its container's, its systemd unit's) still
covers its sandboxes. Only the limits asked for are set up (``Limits.memory_bytes``, ``Limits.pids``).

Joining: the first element of the sandbox's command chain is a tiny ``/bin/sh`` run as the caller (root), which
writes its own pid into each ``cgroup.procs`` and only then execs ``prlimit`` -> ``setpriv`` -> ``bwrap``
(``join_argv``). That is race-free: the program is not running yet, and every process of the sandbox descends from
that shell and inherits its cgroup at fork. Writing the child's pid from the parent after the spawn would race
bwrap's first fork (cgroup v1 moves only the named process, never its existing children), and moving it between
fork and exec needs a ``preexec_fn``, which is unsafe in a threaded caller like the scorer. A failed join exits
125 before anything runs: the sandbox does not start, it never runs unlimited.

The watcher: before it joins, that shell forks one more shell, which stays in the caller's cgroup (no sandbox limit
counts it) and blocks reading the sandbox's lifeline (the pipe whose write end only the caller holds). When the
caller closes it or dies, the watcher SIGKILLs every process left in the sandbox's cgroup. The in-sandbox launcher
watches the same pipe, but it cannot cover a caller that dies while bwrap is still setting the namespace up: bwrap
(killed with its parent by ``--die-with-parent``) has cloned the namespace's init but not yet released it, and that
init, blocked on bwrap's eventfd with no parent-death signal armed yet, would wait forever (pid 1 of its namespace,
reparented to the host's init). The cgroup is the one handle on it that the host keeps.

Afterwards ``hits`` reads which limit fired (v1: ``oom_kill`` in ``memory.oom_control``; v2: ``oom_kill`` in
``memory.events``; both: ``max`` in ``pids.events``), and ``remove`` kills whatever is still in the cgroup and
removes it (rmdir, retried by the caller until the exiting processes are gone).

Stale cgroups: a caller that died (SIGKILL, OOM) leaves its sandboxes' directories. Each ``create`` first sweeps
(at most once a minute per process) the ``floe`` directories for ``sbx-<pid>-<n>`` entries whose pid is no longer
alive and which are older than a minute, kills what is still inside (the watcher's backstop: a watcher that was
itself killed) and removes them.
The age guard keeps a sweeper in another pid namespace from removing a cgroup that was just made.

Unavailable (not root, no controller, a v2 hierarchy that cannot delegate them): ``CgroupUnavailable`` with the
reason; the sandbox then runs with its rlimits only, and ``SandboxResult.cgroup_missing`` says so.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from sandbox.spec import LimitHit

__all__ = ["Cgroup", "CgroupUnavailable", "join_argv", "parent_dirs", "sweep_stale"]

PARENT = "floe"  # our directory in the caller's cgroup
PREFIX = "sbx-"
STALE_AFTER_S = 60.0
_NAME = re.compile(rf"^{PREFIX}(\d+)-\d+$")
_seq = itertools.count(1)
_last_sweep = 0.0


class CgroupUnavailable(Exception):
    """No cgroup limits for this sandbox; the message says why."""


@dataclass(frozen=True)
class _Mount:
    path: Path  # where the hierarchy is mounted
    root: str  # the hierarchy path seen at that mount point (a container may mount a subtree)
    v2: bool
    controllers: frozenset[str]  # v1: the controllers bound to this hierarchy; v2: empty (read from the tree)


def _mounts() -> list[_Mount]:
    found = []
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as fh:
        for line in fh:
            # id parent major:minor root mountpoint options [optional...] - fstype source superoptions
            left, _, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            if len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
                continue
            v2 = tail[0] == "cgroup2"
            controllers = frozenset() if v2 else frozenset(tail[2].split(","))
            found.append(_Mount(Path(_unescape(fields[4])), _unescape(fields[3]), v2, controllers))
    return found


def _unescape(text: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \\ooo
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def _own_cgroups() -> dict[str, str]:
    """The caller's cgroup per hierarchy: controller name (v1), ``name=x`` (named v1) or ``""`` (v2) -> path."""
    own: dict[str, str] = {}
    with contextlib.suppress(OSError), open("/proc/self/cgroup") as fh:
        for line in fh:
            parts = line.rstrip("\n").split(":", 2)
            if len(parts) == 3:
                for controller in parts[1].split(",") if parts[1] else [""]:
                    own[controller] = parts[2]
    return own


def _under(mount: _Mount, cgroup_path: str) -> Path | None:
    """The directory of ``cgroup_path`` in ``mount``, or None when that mount does not show it."""
    root = mount.root.rstrip("/")
    if cgroup_path != root and not cgroup_path.startswith(root + "/"):
        return None
    return mount.path / cgroup_path[len(root) :].lstrip("/")


def _write(path: Path, value: str) -> None:
    with open(path, "w") as fh:
        fh.write(value)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _counter(text: str, key: str) -> int:
    """The value of ``key N`` in a flat-keyed cgroup file (``memory.events``, ``pids.events``, ``oom_control``)."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key and parts[1].isdigit():
            return int(parts[1])
    return 0


@dataclass
class Cgroup:
    """One sandbox's cgroup: a directory per hierarchy (v2: one), and the limits written into them."""

    version: int
    memory_dir: Path | None  # where the memory limit lives (v2: the one directory)
    pids_dir: Path | None
    memory_bytes: int | None
    pids: int | None
    dirs: list[Path] = field(default_factory=list)  # each directory once, for the join and the removal

    @property
    def procs_files(self) -> list[Path]:
        return [d / "cgroup.procs" for d in self.dirs]

    def describe(self) -> str:
        """``v1 memory.limit_in_bytes=67108864 pids.max=32``: what is in force."""
        parts = [f"v{self.version}"]
        if self.memory_bytes is not None:
            parts.append(f"{self._memory_setting()}={self.memory_bytes}")
        if self.pids is not None:
            parts.append(f"pids.max={self.pids}")
        return " ".join(parts)

    def _memory_setting(self) -> str:
        return "memory.max" if self.version == 2 else "memory.limit_in_bytes"

    # ------------------------------------------------------------------------------------------------ create

    @classmethod
    def create(cls, *, memory_bytes: int | None, pids: int | None) -> Cgroup:
        """A fresh cgroup with these limits; ``CgroupUnavailable`` (nothing left behind) when it cannot be made."""
        if memory_bytes is None and pids is None:
            raise CgroupUnavailable("no cgroup limit asked for")
        if os.geteuid() != 0:
            raise CgroupUnavailable("not root: cgroups need root (or a delegated subtree)")
        mounts, own = _mounts(), _own_cgroups()
        sweep_stale(mounts, own)
        name = f"{PREFIX}{os.getpid()}-{next(_seq)}"
        reasons: list[str] = []
        v2 = _v2_parent(mounts, own, reasons)
        if v2 is not None:
            return cls._make(2, {"memory": v2, "pids": v2}, name, memory_bytes, pids)
        parents: dict[str, Path] = {}
        for controller, wanted in (("memory", memory_bytes), ("pids", pids)):
            if wanted is None:
                continue
            mount = next((m for m in mounts if not m.v2 and controller in m.controllers), None)
            base = _under(mount, own.get(controller, "/")) if mount is not None else None
            if base is None:
                reasons.append(f"no cgroup v1 {controller} hierarchy")
                raise CgroupUnavailable("; ".join(reasons))
            parents[controller] = base / PARENT
        return cls._make(1, parents, name, memory_bytes, pids)

    @classmethod
    def _make(
        cls, version: int, parents: dict[str, Path], name: str, memory_bytes: int | None, pids: int | None
    ) -> Cgroup:
        dirs: dict[str, Path] = {c: parent / name for c, parent in parents.items()}
        cg = cls(
            version=version,
            memory_dir=dirs.get("memory") if memory_bytes is not None else None,
            pids_dir=dirs.get("pids") if pids is not None else None,
            memory_bytes=memory_bytes,
            pids=pids,
        )
        try:
            for directory in [cg.memory_dir, cg.pids_dir]:
                if directory is None or directory in cg.dirs:
                    continue
                directory.parent.mkdir(exist_ok=True)
                if version == 2:
                    # A v2 child only gets a controller its parent enables for its children.
                    _write(directory.parent / "cgroup.subtree_control", "+memory +pids")
                directory.mkdir()
                cg.dirs.append(directory)
            if cg.memory_dir is not None and memory_bytes is not None:
                if version == 2:
                    _write(cg.memory_dir / "memory.max", str(memory_bytes))
                    if (cg.memory_dir / "memory.swap.max").exists():
                        _write(cg.memory_dir / "memory.swap.max", "0")
                else:
                    _write(cg.memory_dir / "memory.limit_in_bytes", str(memory_bytes))
                    # RAM + swap at the same value: no swap on top. Set after the RAM limit (memsw may not be
                    # below it).
                    if (cg.memory_dir / "memory.memsw.limit_in_bytes").exists():
                        _write(cg.memory_dir / "memory.memsw.limit_in_bytes", str(memory_bytes))
            if cg.pids_dir is not None and pids is not None:
                _write(cg.pids_dir / "pids.max", str(pids))
        except OSError as exc:
            cg.remove()  # what was made so far: fresh and empty
            raise CgroupUnavailable(f"cannot set up cgroup v{version} {name}: {exc}") from exc
        return cg

    # ---------------------------------------------------------------------------------------------- after it

    def hits(self) -> list[LimitHit]:
        """The cgroup limits that fired, read from the kernel's event counters (before ``remove``)."""
        found: list[LimitHit] = []
        if self.memory_dir is not None and self.memory_bytes is not None:
            events = "memory.events" if self.version == 2 else "memory.oom_control"
            if _counter(_read(self.memory_dir / events), "oom_kill") > 0:
                found.append(LimitHit("memory", self._memory_setting(), self.memory_bytes))
        pids_events = _read(self.pids_dir / "pids.events") if self.pids_dir is not None else ""
        if self.pids is not None and _counter(pids_events, "max") > 0:
            found.append(LimitHit("pids", "pids.max", self.pids))
        return found

    def remove(self) -> bool:
        """One attempt: SIGKILL what is still inside, rmdir each directory. True once all are gone; the caller
        retries while exiting processes still hold them (rmdir answers EBUSY until the last one has left)."""
        for directory in list(self.dirs):
            if not directory.exists():
                self.dirs.remove(directory)
                continue
            try:
                directory.rmdir()
                self.dirs.remove(directory)
            except OSError as exc:
                if exc.errno == errno.EBUSY:
                    _kill_members(directory, self.version)
        return not self.dirs


def _kill_members(directory: Path, version: int) -> None:
    # Normally empty by now (the pid namespace is gone); this is the backstop for anything that is not. Version 2
    # with no cgroup.kill (before Linux 5.14), and v1, signal each listed member.
    if version == 2 and (directory / "cgroup.kill").exists():
        with contextlib.suppress(OSError):
            _write(directory / "cgroup.kill", "1")
        return
    for pid in _read(directory / "cgroup.procs").split():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(int(pid), signal.SIGKILL)


def _v2_parent(mounts: list[_Mount], own: dict[str, str], reasons: list[str]) -> Path | None:
    """``<own v2 cgroup>/floe`` when a cgroup2 hierarchy can give our sandboxes memory and pids, else None."""
    mount = next((m for m in mounts if m.v2), None)
    if mount is None:
        reasons.append("no cgroup v2 hierarchy")
        return None
    base = _under(mount, own.get("", "/"))
    if base is None:
        reasons.append("our cgroup v2 is not visible")
        return None
    available = set(_read(base / "cgroup.controllers").split())
    if not {"memory", "pids"} <= available:
        reasons.append(f"cgroup v2 at {mount.path} offers no memory+pids controllers")
        return None
    enabled = set(_read(base / "cgroup.subtree_control").split())
    if not {"memory", "pids"} <= enabled:
        try:
            # Refused (EBUSY) when our own cgroup holds processes and is not the root: the "no internal process"
            # rule. A service that wants v2 limits then needs a delegated subtree (systemd Delegate=yes).
            _write(base / "cgroup.subtree_control", "+memory +pids")
        except OSError as exc:
            reasons.append(f"cgroup v2: cannot enable memory+pids below {base}: {exc.strerror}")
            return None
    return base / PARENT


def join_argv(procs_files: list[Path], lifeline_fd: int) -> list[str]:
    """The head of the command chain that moves itself into the sandbox's cgroup, then execs the rest (after
    ``--``). Run as the caller (root), before ``prlimit`` and the uid drop; quoted throughout, so no ``IFS`` from the
    environment (the sandbox's) changes what it writes.

    Before it joins, it forks the cgroup's watcher (see the module docstring): blocked on ``lifeline_fd`` until the
    caller closes its end or dies, it then SIGKILLs whatever is left in the cgroup (retrying for up to 5 s while
    processes remain), stdio on /dev/null so it never holds the sandbox's output pipes open. It opens the lifeline
    through ``/proc/self/fd``: dash's ``<&N`` takes one digit only, and a service's fd numbers are higher."""
    script = (
        "life=$1; shift; "
        '( while read -r _; do :; done < "/proc/self/fd/$life"; '
        'n=0; while [ "$n" -lt 100 ]; do left=; '
        'for f; do [ "$f" = -- ] && break; { while read -r p; do left=1; kill -9 "$p"; done < "$f"; } 2>/dev/null; '
        'done; [ -z "$left" ] && exit 0; n=$((n + 1)); sleep 0.05; done ) </dev/null >/dev/null 2>&1 & '
        'while [ "$1" != -- ]; do '
        'echo "$$" > "$1" || { echo "floe sandbox: cannot join cgroup $1" >&2; exit 125; }; shift; '
        'done; shift; exec "$@"'
    )
    return ["/bin/sh", "-c", script, "floe-cgroup-join", str(lifeline_fd), *map(str, procs_files), "--"]


def parent_dirs(mounts: list[_Mount] | None = None, own: dict[str, str] | None = None) -> list[Path]:
    """Where this process's sandbox cgroups are made: ``<own cgroup>/floe`` in each memory/pids/v2 hierarchy."""
    mounts = _mounts() if mounts is None else mounts
    own = _own_cgroups() if own is None else own
    parents: list[Path] = []
    for mount in mounts:
        keys = [""] if mount.v2 else [c for c in ("memory", "pids") if c in mount.controllers]
        for key in keys:
            base = _under(mount, own.get(key, "/"))
            if base is not None and base / PARENT not in parents:
                parents.append(base / PARENT)
    return parents


def sweep_stale(mounts: list[_Mount] | None = None, own: dict[str, str] | None = None, *, force: bool = False) -> int:
    """Empty and remove the sandbox cgroups left by dead callers (see the module docstring); how many were removed."""
    global _last_sweep
    now = time.monotonic()
    if not force and now - _last_sweep < STALE_AFTER_S:
        return 0
    _last_sweep = now
    removed = 0
    for parent in parent_dirs(mounts, own):
        try:
            entries = list(parent.iterdir())
        except OSError:
            continue
        for entry in entries:
            match = _NAME.match(entry.name)
            if match is None or int(match.group(1)) == os.getpid() or _alive(int(match.group(1))):
                continue
            try:
                if time.time() - entry.stat().st_mtime < STALE_AFTER_S:
                    continue
                # cgroup.procs lists only the members visible in our pid namespace: what another namespace's
                # caller runs (whose pid we cannot see, so call dead) is not listed, and so never killed.
                _kill_members(entry, 2)
                entry.rmdir()
                removed += 1
            except OSError:
                continue  # still emptying (removed by the next sweep), or gone already
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
