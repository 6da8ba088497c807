"""What one sandbox is made of: the ``SandboxSpec`` and its parts, owned by this library alone.

A service maps its own settings to a spec (the session runner in ``sessions.launch``, the scorer in
``scorer.sandbox``); nothing here knows about either. Every field has the meaning it has on the bwrap command line
built by ``sandbox.command``; the sandbox always gets, whatever the spec says: read-only ``/usr`` (and the host's
``/bin``, ``/lib``... links), read-only ``/etc``, a fresh ``/proc`` and ``/dev``, a size-capped ``/tmp``, new
user/pid/ipc/uts/cgroup/network namespaces, no nested user namespaces, ``no_new_privs``, no core dumps, a read-only
root (bwrap's own tmpfs, which has no size of its own), and the launcher's lifeline. By default it also gets the
seccomp filter of ``sandbox.seccomp`` (``seccomp=True``), and with ``Limits.memory_bytes`` / ``Limits.pids`` a
cgroup of its own (``sandbox.cgroup``) where the machine has the controllers; where it has not, those two are
simply not in force (``SandboxResult.cgroup_missing`` says why) and the rlimits are what remains.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

__all__ = [
    "RUN_MOUNT",
    "Bind",
    "Bridge",
    "Identity",
    "Keep",
    "LimitHit",
    "LimitKind",
    "Limits",
    "Mount",
    "SandboxError",
    "SandboxSpec",
    "Tmpfs",
]

# Where the run directory (launcher script, identity files, bridge socket) appears inside, read-only.
RUN_MOUNT = "/run/floe"


class SandboxError(RuntimeError):
    """The sandbox could not be built or started: an infrastructure failure, never the sandboxed program's."""


@dataclass(frozen=True)
class Limits:
    """rlimits, set by ``prlimit`` before the uid drop, and the sandbox's cgroup limits. ``None`` leaves a limit as
    inherited (an rlimit) or unset (a cgroup limit). Core dumps are always off. RLIMIT_NPROC counts per uid, so
    sandboxes that must not share it need distinct uids (``UidPool``).

    ``memory_bytes`` and ``pids`` hold for the whole sandbox (every process of it together) through a cgroup of its
    own, where the machine has the controllers (``sandbox.cgroup``): the memory cap counts RAM, swap and the pages of
    its tmpfs mounts (``/tmp``, ``Tmpfs``: they live in RAM), and on hitting it the kernel's OOM killer ends the
    largest process of the sandbox; ``pids`` counts processes and threads, and a fork beyond it fails with EAGAIN.
    The sandbox's own launcher takes about four of them (bwrap twice, the launcher, its helper). While a pids
    cgroup is in force, RLIMIT_NPROC is raised to at least ``pids + 16`` (``sandbox.command.NPROC_OVER_PIDS``): at
    equal values the rlimit refuses first and is named by nothing. Keep RLIMIT_AS (per process, virtual) above
    ``memory_bytes`` for the same reason; the caller chooses that one."""

    nofile: int = 1024
    nproc: int = 256
    fsize_bytes: int = 64 * 1024**2
    address_space_bytes: int | None = None  # crude memory cap (virtual memory, per process); breaks some runtimes
    cpu_s: int | None = None  # CPU seconds per process, not wall time: the caller's timeout is the wall clock
    memory_bytes: int | None = None  # cgroup: RAM + swap of the whole sandbox
    pids: int | None = None  # cgroup: processes + threads of the whole sandbox


LimitKind = Literal["memory", "pids", "cpu", "file-size", "wall-clock"]
_KIND_WORDS: dict[str, str] = {
    "memory": "memory limit",
    "pids": "process-count limit",
    "cpu": "CPU-time limit",
    "file-size": "file-size limit",
    "wall-clock": "wall-clock limit",
}


@dataclass(frozen=True)
class LimitHit:
    """A limit that fired during a sandbox's run: which (``kind``), through what (``setting``: the cgroup file, the
    rlimit, ``timeout``) and at what value (bytes, processes or seconds, by kind)."""

    kind: LimitKind
    setting: str  # "memory.limit_in_bytes" (cgroup v1), "memory.max" (v2), "pids.max", "RLIMIT_CPU", "timeout"...
    value: float

    def __str__(self) -> str:
        """``memory (cgroup memory.limit_in_bytes=67108864)``: the kind first, then exactly what was set."""
        how = f"cgroup {self.setting}" if self.setting.startswith(("memory.", "pids.")) else self.setting
        value = int(self.value) if self.value == int(self.value) else self.value
        return f"{self.kind} ({how}={value})"

    def describe(self) -> str:
        """``memory limit (cgroup, 2.0 GiB)``: for a reason a person reads."""
        if self.setting.startswith(("memory.", "pids.")):
            how = "cgroup"
        elif self.setting == "timeout":
            how = ""
        else:
            how = self.setting
        if self.kind in ("memory", "file-size"):
            amount = _bytes(self.value)
        elif self.kind in ("cpu", "wall-clock"):
            amount = f"{self.value:g} s"
        else:
            amount = f"{self.value:g}"
        return f"{_KIND_WORDS[self.kind]} ({how + ', ' if how else ''}{amount})"


def _bytes(n: float) -> str:
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:g} bytes"


@dataclass(frozen=True)
class Bind:
    """A host path mounted at ``dest``. ``pin=True`` (read-only only) opens the source once and binds that open
    directory, after checking the sandbox uid can reach it: the path cannot be swapped between check and mount, and
    an unreachable install is a clear ``SandboxError`` instead of a bwrap failure."""

    source: Path
    dest: str
    writable: bool = False
    pin: bool = False

    def __post_init__(self) -> None:
        if self.pin and self.writable:
            raise ValueError("a pinned bind is read-only")


@dataclass(frozen=True)
class Tmpfs:
    """A fresh tmpfs of at most ``size_bytes`` at ``dest``: writes land in RAM, the host disk never changes."""

    dest: str
    size_bytes: int
    mode: int = 0o755


Mount = Bind | Tmpfs


@dataclass(frozen=True)
class Bridge:
    """The sandbox's only way out with ``network="none"``: ``127.0.0.1:<port>`` inside is carried over a Unix socket
    in the run directory to ``upstream`` (host, port) on the host (``sandbox.bridge``)."""

    port: int
    upstream: tuple[str, int]
    socket_name: str = "gateway.sock"


@dataclass(frozen=True)
class Identity:
    """A two-line ``/etc/passwd`` and ``/etc/group`` for the sandbox uid (``root`` and ``user``), over the host's:
    programs that ask who they are (node's ``os.userInfo``, ``getpwuid``, git) get an answer, and the host's user
    list stays hidden."""

    user: str
    home: str
    shell: str = "/bin/sh"


@dataclass(frozen=True)
class Keep:
    """How much of one output stream is kept: the first ``head`` and the last ``tail`` bytes (a flood costs no
    memory). Everything is kept while the stream fits in ``head + tail``."""

    head: int = 0
    tail: int = 64 * 1024


@dataclass(frozen=True)
class SandboxSpec:
    """One sandboxed command.

    ``uid``/``gid``: the unprivileged identity it runs as (``setpriv``); ``None`` runs it as the caller, which is
    refused for root (inside a user namespace root is still root for every file it can reach). ``env`` is the
    sandbox's whole environment. ``mounts`` are applied in order, after the fixed system mounts and ``/tmp`` (so a
    mount under ``/tmp`` is not shadowed). ``run_dir`` is a host directory the launcher writes its files into and
    mounts read-only at ``RUN_MOUNT``; ``None`` makes a private temporary one, removed with the sandbox.
    ``stderr=None`` merges stderr into stdout in the order written (one stream, one ``Keep``). ``seccomp``: the
    filter of ``sandbox.seccomp`` (on by default; off only for a program that needs a denied syscall, knowingly).
    """

    argv: list[str]
    uid: int | None
    gid: int | None
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str = "/"
    mounts: tuple[Mount, ...] = ()
    tmp_bytes: int = 256 * 1024**2
    limits: Limits = field(default_factory=Limits)
    network: Literal["none", "host"] = "none"
    bridge: Bridge | None = None
    identity: Identity | None = None
    run_dir: Path | None = None
    init_python: Path = Path("/usr/bin/python3")  # runs the Python launcher of a bridged sandbox (stdlib only)
    stdout: Keep = field(default_factory=Keep)
    stderr: Keep | None = field(default_factory=Keep)
    seccomp: bool = True

    def __post_init__(self) -> None:
        if not self.argv:
            raise ValueError("a sandbox needs a command")
        if (self.uid is None) != (self.gid is None):
            raise ValueError("uid and gid go together")
        if self.bridge is not None and self.network != "none":
            raise ValueError("the bridge is the network of a sandbox without one: network must be 'none'")
