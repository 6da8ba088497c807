"""Run floe's services as separate local processes: start, wait until ready, kill, restart, stop.

Used by ``floe demo`` and by the end-to-end tests (fault tolerance kills services with SIGKILL and restarts them).
Every service runs as ``python -m <package>`` in its own process group with its log in ``<run_dir>/logs/<name>.log``,
so a kill reaches the whole tree and nothing survives ``stop_all``.

Not covered: restarting crashed services by itself (the demo reports a crash; it does not hide it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ServiceSpec", "Stack", "StackError", "python_module"]


class StackError(RuntimeError):
    """A service did not start, or died while we waited for it."""


@dataclass(frozen=True)
class ServiceSpec:
    """How to run one service. ``ready_url`` is polled until it answers 2xx; ``ready`` is an extra predicate."""

    name: str
    argv: list[str]
    env: Mapping[str, str] = field(default_factory=dict)
    ready_url: str | None = None
    ready: Callable[[], bool] | None = None
    ready_timeout_s: float = 120.0


@dataclass
class _Running:
    spec: ServiceSpec
    proc: subprocess.Popen[bytes]
    log_path: Path
    restarts: int = 0


class Stack:
    """A set of running services under one run directory."""

    def __init__(self, run_dir: Path, base_env: Mapping[str, str] | None = None) -> None:
        self.run_dir = run_dir
        self.logs = run_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.base_env = dict(os.environ if base_env is None else base_env)
        self._running: dict[str, _Running] = {}

    # ---------------------------------------------------------------------------------------------- lifecycle

    def start(self, spec: ServiceSpec, wait: bool = True) -> None:
        if spec.name in self._running and self._running[spec.name].proc.poll() is None:
            raise StackError(f"{spec.name} is already running")
        log_path = self.logs / f"{spec.name}.log"
        env = {**self.base_env, **spec.env, "PYTHONUNBUFFERED": "1"}
        with log_path.open("ab") as log:
            log.write(f"\n===== start {time.strftime('%H:%M:%S')} {' '.join(spec.argv)}\n".encode())
            log.flush()
            proc = subprocess.Popen(
                spec.argv,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=self.run_dir,
            )
        previous = self._running.get(spec.name)
        self._running[spec.name] = _Running(spec, proc, log_path, previous.restarts + 1 if previous else 0)
        if wait:
            self.wait_ready(spec.name)

    def wait_ready(self, name: str) -> None:
        running = self._running[name]
        spec = running.spec
        deadline = time.monotonic() + spec.ready_timeout_s
        while time.monotonic() < deadline:
            if running.proc.poll() is not None:
                code = running.proc.returncode
                raise StackError(f"{name} exited with {code}; see {running.log_path}\n{self.tail(name)}")
            if (spec.ready_url is None or _answers(spec.ready_url)) and (spec.ready is None or spec.ready()):
                return
            time.sleep(0.2)
        waited = f"{spec.ready_timeout_s:.0f}s"
        raise StackError(f"{name} not ready after {waited}; see {running.log_path}\n{self.tail(name)}")

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the service's whole process group and reap it (SIGKILL by default: a crash)."""
        proc = self._running[name].proc
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)

    def restart(self, name: str) -> None:
        self.kill(name)
        self.start(self._running[name].spec)

    def stop(self, name: str, timeout_s: float = 20.0) -> None:
        running = self._running.get(name)
        if running is None or running.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(running.proc.pid, signal.SIGTERM)
        try:
            running.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill(name)
        # The group may still hold children that ignored SIGTERM (a harness, say): make sure they are gone.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(running.proc.pid, signal.SIGKILL)

    def stop_all(self, timeout_s: float = 20.0) -> None:
        """Stop every service, last started first, each with ``timeout_s`` to drain before SIGKILL.

        One at a time on purpose: a gateway node drains its sessions while the engine it proxies is still up. (In
        parallel, a node stopping beside its engine once hung past its deadline while starting a sandbox, and the
        SIGKILL left that sandbox's bwrap behind: tests/e2e/test_fault_tolerance.py caught it.) Each service's log
        ends with how it stopped and how long it took.
        """
        for name in reversed(list(self._running)):
            running = self._running[name]
            if running.proc.poll() is not None:
                continue
            started = time.monotonic()
            self.stop(name, timeout_s)
            how = "SIGTERM" if time.monotonic() - started < timeout_s else "SIGKILL after SIGTERM timed out"
            with running.log_path.open("ab") as log:
                log.write(f"===== stopped ({how}) in {time.monotonic() - started:.1f}s\n".encode())

    # ------------------------------------------------------------------------------------------------ queries

    def alive(self, name: str) -> bool:
        running = self._running.get(name)
        return running is not None and running.proc.poll() is None

    def dead(self) -> list[str]:
        return [name for name, r in self._running.items() if r.proc.poll() is not None]

    def pid(self, name: str) -> int:
        return self._running[name].proc.pid

    def tail(self, name: str, lines: int = 30) -> str:
        path = self._running[name].log_path
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()


def python_module(module: str, *args: str) -> list[str]:
    """argv running ``python -m module`` with the interpreter we run under (the workspace venv)."""
    return [sys.executable, "-m", module, *args]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return 200 <= int(resp.status) < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False
