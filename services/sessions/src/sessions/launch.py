"""How a session's sandbox is shaped: ``SessionSettings`` mapped to a ``sandbox.SandboxSpec``.

Every session command (prepare steps, the harness, diff collection) runs through the one launcher (``libs/sandbox``)
with this shape:

- the agent uid (``agent_uid``/``agent_gid``, no passwd entry on the host; a two-line ``/etc/passwd`` inside);
- the harness install read-only at its node path (venv shebangs and npm's absolute links keep working), a private
  HOME at ``sandbox_home`` and the task workspace at ``sandbox_workspace`` (both writable), a ``tmp_size_mb``
  ``/tmp``; ``/work``, ``/root``, ``/home``, ``/var`` and every other session are simply not there;
- no network, except the bridge to this node's gateway at ``127.0.0.1:<inner_gateway_port>`` for the harness, and
  the host's network for prepare steps when ``prepare_network`` allows it;
- the ``rlimit_*`` limits, and the last ``output_tail_bytes`` of stdout and of stderr.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from sandbox import Bind, Bridge, Identity, Keep, Limits, SandboxSpec
from sessions.settings import SessionSettings

__all__ = ["find_cli", "sandbox_env", "session_spec"]

MIB = 1024 * 1024


def sandbox_env(settings: SessionSettings, path_prepend: Sequence[str], env: Mapping[str, str]) -> dict[str, str]:
    """The whole environment of a session command: a fixed base, then the preset's (``env`` wins)."""
    path = [*path_prepend, "/usr/local/bin", "/usr/bin", "/bin", "/usr/local/sbin", "/usr/sbin", "/sbin"]
    return {
        "HOME": settings.sandbox_home,
        "USER": "agent",
        "LOGNAME": "agent",
        "SHELL": "/bin/sh",
        "PATH": ":".join(path),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "TMPDIR": "/tmp",
        "NO_COLOR": "1",
        "CI": "1",
        **env,
    }


def session_spec(
    settings: SessionSettings,
    argv: list[str],
    *,
    workspace: Path,
    home: Path,
    run_dir: Path,
    env: Mapping[str, str] | None = None,
    path_prepend: Sequence[str] = (),
    network: Literal["none", "host"] = "none",
    gateway: tuple[str, int] | None = None,
) -> SandboxSpec:
    """``argv`` in the session sandbox; ``gateway`` (the proxy's TCP address) opens the bridge to it."""
    s = settings
    mounts: list[Bind] = []
    if s.harness_home.is_dir():
        mounts.append(Bind(s.harness_home, str(s.harness_home), pin=True))
    mounts += [Bind(home, s.sandbox_home, writable=True), Bind(workspace, s.sandbox_workspace, writable=True)]
    keep = Keep(tail=s.output_tail_bytes)
    return SandboxSpec(
        argv=argv,
        uid=s.agent_uid,
        gid=s.agent_gid,
        env=sandbox_env(s, path_prepend, env or {}),
        cwd=s.sandbox_workspace,
        mounts=tuple(mounts),
        tmp_bytes=s.tmp_size_mb * MIB,
        limits=Limits(
            nofile=s.rlimit_nofile,
            nproc=s.rlimit_nproc,
            fsize_bytes=s.rlimit_fsize_mb * MIB,
            address_space_bytes=s.rlimit_as_mb * MIB if s.rlimit_as_mb is not None else None,
            memory_bytes=s.memory_mb * MIB if s.memory_mb is not None else None,
            pids=s.pids,
        ),
        network=network,
        bridge=Bridge(port=s.inner_gateway_port, upstream=gateway) if gateway is not None else None,
        identity=Identity(user="agent", home=s.sandbox_home),
        run_dir=run_dir,
        init_python=s.bridge_python,
        stdout=keep,
        stderr=keep,
    )


def find_cli(cli: str, path_prepend: list[str]) -> str | None:
    """Where ``cli`` resolves on the sandbox PATH (the harness install keeps its node path, /usr is shared)."""
    if "/" in cli:
        return cli if os.access(cli, os.X_OK) else None
    for directory in [*path_prepend, "/usr/local/bin", "/usr/bin", "/bin"]:
        candidate = Path(directory) / cli
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None
