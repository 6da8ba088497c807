"""What one sandbox is made of: the ``SandboxSpec`` and its parts, owned by this library alone.

A service maps its own settings to a spec (the session runner in ``sessions.launch``, the scorer in
``scorer.sandbox``); nothing here knows about either. Every field has the meaning it has on the bwrap command line
built by ``sandbox.command``; the sandbox always gets, whatever the spec says: read-only ``/usr`` (and the host's
``/bin``, ``/lib``... links), read-only ``/etc``, a fresh ``/proc`` and ``/dev``, a size-capped ``/tmp``, new
user/pid/ipc/uts/cgroup/network namespaces, no nested user namespaces, ``no_new_privs``, no core dumps, and the
launcher's lifeline.
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
    """rlimits, set by ``prlimit`` before the uid drop. ``None`` leaves a limit as inherited. Core dumps are always
    off. RLIMIT_NPROC counts per uid, so sandboxes that must not share it need distinct uids (``UidPool``)."""

    nofile: int = 1024
    nproc: int = 256
    fsize_bytes: int = 64 * 1024**2
    address_space_bytes: int | None = None  # crude memory cap (virtual memory); breaks some runtimes
    cpu_s: int | None = None  # CPU seconds per process, not wall time: the caller's timeout is the wall clock


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
    ``stderr=None`` merges stderr into stdout in the order written (one stream, one ``Keep``).
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

    def __post_init__(self) -> None:
        if not self.argv:
            raise ValueError("a sandbox needs a command")
        if (self.uid is None) != (self.gid is None):
            raise ValueError("uid and gid go together")
        if self.bridge is not None and self.network != "none":
            raise ValueError("the bridge is the network of a sandbox without one: network must be 'none'")
