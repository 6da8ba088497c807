"""Every service's entry point, started as a user starts it: a real ``--help`` (nothing starts), unknown flags
refused, flags that win over the environment, and a broker that is not there said in one line, not a traceback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from eventbus import KafkaSettings

REPO = Path(__file__).resolve().parents[1]

# python -m <argv...>, and the flags its help must list.
ENTRY_POINTS = {
    "gateway": (["gateway"], ["--host", "--port", "--broker", "--engine-url"]),
    "sessions": (["sessions"], ["--port", "--broker", "--engine-url", "--node-id", "--max-running"]),
    "rollout": (["rollout"], ["--host", "--port", "--broker"]),
    "scorer": (["scorer"], ["--broker", "--task-source", "--workers", "--backend"]),
    "learner": (["learner", "serve"], ["--broker", "--model-dir", "--checkpoint-dir"]),
    "inference": (["inference"], ["--engine", "--model", "--host", "--port", "--broker"]),
    "dashboard": (["dashboard"], ["--host", "--port", "--broker"]),
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(argv: list[str], env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=REPO,
    )


@pytest.mark.parametrize("service", sorted(ENTRY_POINTS))
def test_help_prints_the_flags_and_starts_nothing(service: str) -> None:
    argv, flags = ENTRY_POINTS[service]
    # A broker address nothing listens on: a service that started anyway would fail or hang, not print help.
    done = _run([*argv, "--help"], env={"FLOE_KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{_free_port()}"})
    assert done.returncode == 0, done.stderr[-2000:]
    for flag in flags:
        assert flag in done.stdout, f"{service} --help does not list {flag}:\n{done.stdout}"
    assert "overrides FLOE_" in done.stdout
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("service", sorted(ENTRY_POINTS))
def test_an_unknown_flag_is_refused(service: str) -> None:
    argv, _ = ENTRY_POINTS[service]
    done = _run([*argv, "--no-such-flag", "1"])
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "unrecognized arguments: --no-such-flag" in done.stderr


@pytest.mark.integration
def test_floe_serve_passes_flags_that_win_over_the_environment(kafka_settings: KafkaSettings) -> None:
    # `floe serve dashboard --port P` used to be ignored in favour of FLOE_DASHBOARD_PORT (or the default).
    port, env_port = _free_port(), _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "floe",
            "serve",
            "dashboard",
            "--port",
            str(port),
            "--broker",
            kafka_settings.bootstrap_servers,
        ],
        env={**os.environ, "FLOE_DASHBOARD_PORT": str(env_port), "FLOE_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"the dashboard exited: {proc.stderr.read()[-2000:] if proc.stderr else ''}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as resp:
                    assert resp.status == 200
                break
            except OSError:
                assert time.monotonic() < deadline, "the dashboard never listened on --port"
                time.sleep(0.3)
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{env_port}/", timeout=2)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.parametrize("service", ["gateway", "sessions"])
def test_a_missing_broker_is_one_clear_line_and_exit_2(service: str, tmp_path: Path) -> None:
    # `python -m gateway` against no broker used to end in uvicorn's traceback of the lifespan.
    closed = _free_port()
    done = _run(
        [service, "--broker", f"127.0.0.1:{closed}", "--port", str(_free_port())],
        env={"FLOE_GATEWAY_SESSIONS_WORK_ROOT": str(tmp_path / "work"), "FLOE_KAFKA_ADMIN_TIMEOUT_S": "5"},
        timeout=180,
    )
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    assert "cannot start: the Kafka broker is unreachable" in done.stderr
    assert f"127.0.0.1:{closed}" in done.stderr and "floe kafka up" in done.stderr
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
