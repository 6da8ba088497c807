"""Fixtures the end-to-end tests share: a Docker engine for the compose and docker-grading tests.

``docker_engine`` starts dockerd when none answers (deploy/docker/dockerd.sh) once per test session, and stops it
at the end, checking that the host is left as it was found (no engine processes, no docker0, forwarding and the
firewall as before). An engine that was already running is used and left alone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "deploy" / "docker"


def _run(argv: list[str], env: dict[str, str], timeout: float, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc


def _host_network() -> dict[str, str]:
    """What a Docker engine changes on the host (compared before and after the test)."""

    def read(argv: list[str]) -> str:
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout
        except FileNotFoundError:
            return ""

    return {
        "ip_forward": Path("/proc/sys/net/ipv4/ip_forward").read_text().strip(),
        "forward_policy": next(
            (ln for ln in read(["iptables", "-S", "FORWARD"]).splitlines() if ln.startswith("-P")), ""
        ),
        "docker_chains": " ".join(sorted(ln for ln in read(["iptables", "-S"]).splitlines() if "DOCKER" in ln)),
        "docker0": "yes"
        if subprocess.run(["ip", "link", "show", "docker0"], capture_output=True).returncode == 0
        else "no",
    }


def _engine_running() -> bool:
    return subprocess.run(["docker", "version"], capture_output=True, timeout=30).returncode == 0


@pytest.fixture(scope="session")
def docker_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    if shutil.which("docker") is None or (shutil.which("dockerd") is None and not _engine_running()):
        pytest.fail("no Docker engine: `make test-deps` installs one (Debian: docker.io docker-compose debootstrap)")
    before = _host_network()
    started = not _engine_running()
    state = tmp_path_factory.mktemp("dockerd")
    env = {**os.environ, "FLOE_DOCKERD_STATE_DIR": str(state)}
    try:
        # Inside the try: a failed start may still leave an engine running, which the stop below removes.
        _run(["bash", str(DOCKER / "dockerd.sh"), "start"], env, timeout=120)
        yield env
    finally:
        _run(["bash", str(DOCKER / "dockerd.sh"), "stop"], env, timeout=180)
        if started:
            # The machine is left as it was found: no engine, no bridge, forwarding and firewall as before.
            assert not _engine_running(), "dockerd still answers after stop"
            leftover = subprocess.run(["pgrep", "-f", "dockerd|containerd-shim"], capture_output=True, text=True)
            assert leftover.stdout.strip() == "", f"engine processes left: {leftover.stdout}"
            assert _host_network() == before
