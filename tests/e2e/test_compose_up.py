"""``docker compose up`` for real: the images build here; the cpu profile trains in containers and survives a crash.

The test starts a Docker engine when none runs (the ``docker_engine`` fixture of tests/e2e/conftest.py:
deploy/docker/dockerd.sh, which restores ip_forward, iptables and
docker0 when it stops it), builds every image the cpu profile uses from a local base (deploy/docker/compose-local.sh:
no registry is reachable here), runs the profile under its own project name and host ports, and from outside the
containers (the host venv's Kafka client on the broker's published HOST listener) checks that training happens:
weight versions advance. Then it SIGKILLs the rollout service's process from the host (not ``docker kill``, which
Docker treats as a manual stop and does not restart), checks that compose's restart policy brings it back and that
training goes on, runs ``floe audit`` (exactly-once across the crash), and ends with ``down -v``.

On a failure the services' logs are printed. Cold (no images) the builds dominate: see README "Docker compose".
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from eventbus import KafkaSettings
from eventbus.broker import free_port
from eventbus.testing import newest_weight_version

pytestmark = [pytest.mark.slow, pytest.mark.compose]

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "deploy" / "docker"
STEPS_BEFORE_CRASH = 3
STEPS_AFTER_CRASH = 2
# The images build inside this budget cold (torch included), in seconds once cached.
BUILD_TIMEOUT_S = 1800
STEP_TIMEOUT_S = 420.0


def _run(argv: list[str], env: dict[str, str], timeout: float, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc


class Stack:
    def __init__(self, env: dict[str, str]) -> None:
        self.project = f"floe-test-{uuid.uuid4().hex[:8]}"
        self.kafka_port = free_port()
        self.env = {
            **env,
            "COMPOSE_PROJECT_NAME": self.project,
            "FLOE_KAFKA_HOST_PORT": str(self.kafka_port),
            "FLOE_GATEWAY_HOST_PORT": str(free_port()),
            "FLOE_DASHBOARD_HOST_PORT": str(free_port()),
            # The toy agent is the only harness the cpu profile runs: the gateway image skips the other CLIs.
            "FLOE_HARNESSES": "toy-agent",
        }
        self.kafka = KafkaSettings(bootstrap_servers=f"127.0.0.1:{self.kafka_port}")
        self.t0 = time.monotonic()

    def say(self, msg: str) -> None:
        print(f"[compose {time.monotonic() - self.t0:6.1f}s] {msg}", flush=True)

    def compose(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
        return _run(["bash", str(DOCKER / "compose-local.sh"), *args], self.env, timeout=timeout, check=check)

    def container(self, service: str) -> str:
        out = self.compose("ps", "-q", service).stdout.split()
        assert out, f"no container for {service}"
        return out[0]

    def inspect(self, service: str) -> dict[str, object]:
        proc = _run(["docker", "inspect", self.container(service)], self.env, timeout=60)
        state: dict[str, object] = json.loads(proc.stdout)[0]
        return state

    def newest_version(self) -> int:
        return newest_weight_version(self.kafka, idle_timeout_s=2.0)

    def wait(self, what: str, cond: Callable[[], bool], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                if cond():
                    return
            except Exception as exc:  # the broker may not answer yet: keep polling until the deadline
                last = exc
            else:
                last = None
            time.sleep(3)
        raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what} (last error: {last!r})")

    def wait_version(self, at_least: int) -> int:
        self.wait(f"weight version {at_least}", lambda: self.newest_version() >= at_least, STEP_TIMEOUT_S)
        v = self.newest_version()
        self.say(f"weight version {v}")
        return v

    def logs(self) -> str:
        return self.compose("logs", "--no-color", "--tail", "60", timeout=120, check=False).stdout


def test_compose_cpu_profile_trains_and_survives_a_crash(docker_engine: dict[str, str]) -> None:
    stack = Stack(docker_engine)
    t = time.monotonic()
    stack.compose("build", timeout=BUILD_TIMEOUT_S)
    stack.say(f"images built in {time.monotonic() - t:.0f}s")
    try:
        stack.compose("up", "-d", timeout=600)
        stack.say("up")
        v = stack.wait_version(STEPS_BEFORE_CRASH)

        # Crash the rollout service from the host: its process, not the container (docker kill = a manual stop).
        before = stack.inspect("rollout")
        pid = int(before["State"]["Pid"])  # type: ignore[index]
        restarts = int(before["RestartCount"])  # type: ignore[arg-type]
        assert pid > 0
        os.kill(pid, signal.SIGKILL)
        stack.say(f"SIGKILL to the rollout's process {pid}")

        def restarted() -> bool:
            state = stack.inspect("rollout")
            return int(state["RestartCount"]) > restarts and bool(state["State"]["Running"])  # type: ignore[arg-type,index]

        stack.wait("compose to restart the rollout", restarted, 120)
        stack.say("rollout restarted by its restart policy")
        v = stack.wait_version(v + STEPS_AFTER_CRASH)

        audit = _run(
            [
                sys.executable,
                "-m",
                "floe",
                "audit",
                "--bootstrap",
                stack.kafka.bootstrap_servers,
                "--idle-timeout",
                "3",
            ],
            stack.env,
            timeout=300,
            check=False,
        )
        print(audit.stdout)
        assert audit.returncode == 0, f"floe audit found problems:\n{audit.stdout[-3000:]}\n{audit.stderr[-2000:]}"
        stack.say("floe audit clean")
    except BaseException:
        print(stack.logs())
        raise
    finally:
        stack.compose("down", "-v", "--remove-orphans", timeout=300, check=False)
    left = _run(["docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project={stack.project}"], stack.env, 60)
    assert left.stdout.strip() == "", f"containers left after down: {left.stdout}"
