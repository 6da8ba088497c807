"""Drive the local development broker (``deploy/kafka/kafka.sh``) from Python: the test plugin and ``floe kafka``.

This module only runs the script; the script owns formatting, the pid file and stopping by pid. Locating the
script: ``$FLOE_KAFKA_SH`` if set, else ``deploy/kafka/kafka.sh`` in the source checkout this package lives in, else
in the current directory or one of its parents.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["BrokerError", "LocalBroker", "find_kafka_sh", "free_port"]


class BrokerError(RuntimeError):
    """The local broker could not be started, stopped or found. The message says why and what to do."""


def find_kafka_sh() -> Path:
    override = os.environ.get("FLOE_KAFKA_SH")
    if override:
        path = Path(override)
        if not path.is_file():
            raise BrokerError(f"FLOE_KAFKA_SH={override} does not exist")
        return path
    here = Path(__file__).resolve()
    candidates = [p / "deploy" / "kafka" / "kafka.sh" for p in here.parents]
    cwd = Path.cwd().resolve()
    candidates += [p / "deploy" / "kafka" / "kafka.sh" for p in (cwd, *cwd.parents)]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise BrokerError(
        "deploy/kafka/kafka.sh not found: run from a floe checkout or set FLOE_KAFKA_SH to the script's path"
    )


def free_port() -> int:
    """A port that was free a moment ago (the kernel picks it; a race with another process is possible)."""
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports that were free a moment ago. Bound together, so they differ: two ``free_port()`` calls
    in a row can return the same port (a CI run once gave the broker its listener and controller on one port)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]


@dataclass(frozen=True)
class LocalBroker:
    """One broker instance, identified by its state directory."""

    state_dir: Path
    script: Path

    @classmethod
    def at(cls, state_dir: Path | str) -> LocalBroker:
        return cls(Path(state_dir).resolve(), find_kafka_sh())

    @property
    def log_path(self) -> Path:
        return self.state_dir / "broker.log"

    @property
    def pid_path(self) -> Path:
        return self.state_dir / "kafka.pid"

    def _run(
        self,
        *args: str,
        timeout: float | None = None,
        extra_env: dict[str, str] | None = None,
        wrap: Sequence[str] = (),
        extra_props: Sequence[str] = (),
    ) -> str:
        env = {**os.environ, **(extra_env or {})}
        try:
            done = subprocess.run(
                [*wrap, "bash", str(self.script), *args, "--state-dir", str(self.state_dir)],
                capture_output=True,
                text=True,
                timeout=timeout,
                env=env,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise BrokerError(
                f"kafka.sh {args[0]} did not finish within {timeout}s; broker log: {self.log_path}"
            ) from exc
        if done.returncode != 0:
            detail = done.stderr.strip() or done.stdout.strip() or f"exit {done.returncode}"
            raise BrokerError(detail)
        return done.stdout.strip()

    def start(
        self,
        port: int | None = None,
        controller_port: int | None = None,
        *,
        owner_pid: int | None = None,
        ready_timeout_s: float = 90.0,
        heap: str | None = None,
        host: str | None = None,
        wrap: Sequence[str] = (),
        extra_props: Sequence[str] = (),
    ) -> str:
        """Start (idempotent) and return the bootstrap address once the broker is ready.

        ``host``: the address clients reach (default 127.0.0.1, or what this state dir last ran with). ``wrap``: an
        argv prefix the script runs under, e.g. ``ip netns exec NS`` to put the broker on a simulated host
        (``floe.hosts``); stopping needs no prefix (the script stops by pid). ``extra_props``: ``key=value`` broker
        settings added to this start's server.properties."""
        if port is not None and port == controller_port:
            raise BrokerError(f"the listener and the controller need two ports, both were given {port}")
        args = ["start", "--timeout", str(int(ready_timeout_s))]
        if host is not None:
            args += ["--host", host]
        if port is not None:
            args += ["--port", str(port)]
        if controller_port is not None:
            args += ["--controller-port", str(controller_port)]
        if owner_pid is not None:
            args += ["--owner-pid", str(owner_pid)]
        env = {"FLOE_KAFKA_HEAP": heap} if heap else {}
        if extra_props:
            env["FLOE_KAFKA_EXTRA_PROPS"] = "\n".join(extra_props)
        out = self._run(*args, timeout=ready_timeout_s + 60, extra_env=env or None, wrap=wrap)
        return out.splitlines()[-1].strip()

    def stop(self, timeout_s: float = 30.0) -> None:
        self._run("stop", timeout=timeout_s + 30, extra_env={"FLOE_KAFKA_STOP_TIMEOUT": str(int(timeout_s))})

    def status(self) -> str | None:
        """``"running pid=… address=… state=…"`` or None when stopped."""
        try:
            return self._run("status", timeout=30)
        except BrokerError:
            return None

    def pid(self) -> int | None:
        status = self.status()
        if status is None:
            return None
        for part in status.split():
            if part.startswith("pid="):
                return int(part.removeprefix("pid="))
        return None

    def address(self) -> str | None:
        path = self.state_dir / "address"
        return path.read_text().strip() if path.is_file() and self.status() else None

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no broker log)"


def wait_gone(pid: int, timeout_s: float) -> bool:
    """True once ``pid`` no longer exists (polling; no signals sent)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False
