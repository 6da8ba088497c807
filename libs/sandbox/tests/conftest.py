"""Fixtures of the launcher tests: real bubblewrap sandboxes (these tests run as root, like the services).

- ``uid``: an unprivileged uid block of this test session's own (random), so concurrent test sessions never share
  RLIMIT_NPROC or mistake each other's processes for leaks.
- ``scratch``: a fresh directory the sandbox uid can traverse (pytest's tmp dirs are 0700), removed afterwards.
- ``shape``: the two shapes the services give a sandbox, as the parameter of a test: ``session`` (the session
  runner: identity, writable workspace and HOME, the caller's run directory, separate stdout and stderr, a bridge
  when asked) and ``grading`` (the scorer: read-only input, a size-capped tmpfs testbed, a private run directory,
  stdout and stderr merged, CPU and memory limits).
"""

from __future__ import annotations

import asyncio
import os
import random
import secrets
import shutil
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import uvloop

from sandbox import Bind, Identity, Keep, Limits, SandboxSpec, Tmpfs

Shape = Callable[..., SandboxSpec]
BOTH_LOOPS = ("test_event_loops.py",)  # run on asyncio's loop and on uvloop, the one uvicorn serves the services on


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> Mapping[str, Callable[[], Any]]:
    if item.path.name in BOTH_LOOPS:
        return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
    return {"asyncio": asyncio.new_event_loop}


@pytest.fixture(scope="session")
def uid() -> int:
    return random.randrange(200_000, 2_000_000, 16)


@pytest.fixture
def scratch() -> Iterator[Path]:
    root = Path("/tmp") / f"floe-sandbox-test-{secrets.token_hex(6)}"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def session_shaped(scratch: Path, uid: int, argv: list[str], **kw: object) -> SandboxSpec:
    ws, home, run = scratch / "ws", scratch / "home", scratch / "run"
    for d in (ws, home, run):
        d.mkdir(exist_ok=True)
    for d in (ws, home):
        os.chown(d, uid, uid)
    fields: dict[str, object] = {
        "argv": argv,
        "uid": uid,
        "gid": uid,
        "env": {"PATH": "/usr/bin:/bin", "HOME": "/home/agent", "LANG": "C.UTF-8"},
        "cwd": "/workspace",
        "mounts": (Bind(home, "/home/agent", writable=True), Bind(ws, "/workspace", writable=True)),
        "identity": Identity(user="agent", home="/home/agent"),
        "run_dir": run,
        "limits": Limits(nofile=4096, nproc=4096, fsize_bytes=2 * 1024**3),
    }
    fields.update(kw)
    return SandboxSpec(**fields)  # type: ignore[arg-type]


def grading_shaped(scratch: Path, uid: int, argv: list[str], **kw: object) -> SandboxSpec:
    inp = scratch / "in"
    inp.mkdir(exist_ok=True)
    os.chmod(inp, 0o755)
    fields: dict[str, object] = {
        "argv": argv,
        "uid": uid,
        "gid": uid,
        "env": {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "FLOE_IN": "/floe", "TESTBED": "/testbed"},
        "cwd": "/testbed",
        "mounts": (Bind(inp, "/floe"), Tmpfs("/testbed", 32 * 1024**2)),
        "limits": Limits(cpu_s=20, address_space_bytes=2 * 1024**3, nproc=64, fsize_bytes=8 * 1024**2),
        "stdout": Keep(head=2 * 1024**2, tail=2 * 1024**2),
        "stderr": None,
    }
    fields.update(kw)
    return SandboxSpec(**fields)  # type: ignore[arg-type]


SHAPES: dict[str, Shape] = {"session": session_shaped, "grading": grading_shaped}


@pytest.fixture(params=sorted(SHAPES))
def shape(request: pytest.FixtureRequest) -> Shape:
    return SHAPES[request.param]


def live_pids(*, marker: str | None = None, uids: range = range(0), pids: tuple[int, ...] = ()) -> list[int]:
    """Host processes (zombies excepted: they hold nothing) carrying ``marker`` on their command line, running as
    one of ``uids``, or in ``pids``: the leak check."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            status = (entry / "status").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields.get("State", "").split()[:1] == ["Z"]:
            continue
        marked = marker is not None and marker.encode() in cmdline
        if marked or int(fields["Uid"].split()[1]) in uids or int(entry.name) in pids:
            found.append(int(entry.name))
    return found


def daemon_script(marker: str) -> str:
    """A shell command that leaves a daemon (own session, no terminal, stdio detached) and then hangs."""
    return f"setsid nohup python3 -c 'import time; time.sleep(300)' {marker} >/dev/null 2>&1 & sleep 300"
