"""Fixtures the end-to-end tests share: a toy demo stack for the fault tests, a Docker engine for the compose and
docker-grading tests.

``toy_demo`` starts a toy ``floe demo`` stack (tiny model, no dashboard, the test decides when to stop) with the
rollout's group deadline and cancel grace short enough that sessions on a killed node end within a test; at the end
it stops everything and checks that no process of the run (a sandbox of a killed node, say) survived. The run
directory is removed after a pass (``demo.passed = True``) unless ``FLOE_E2E_KEEP=1``.

``docker_engine`` starts dockerd when none answers (deploy/docker/dockerd.sh) once per test session, and stops it
at the end, checking that the host is left as it was found (no engine processes, no docker0, forwarding and the
firewall as before). An engine that was already running is used and left alone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from floe.demo import Demo, DemoConfig
from floe.hosts import Host

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "deploy" / "docker"

GROUP_DEADLINE_S = 30  # cancels the sessions that died with a gateway node ...
CANCEL_GRACE_S = 10  # ... and this long after the cancel the rollout ends them itself (masked rows)


@pytest.fixture
def toy_demo() -> Iterator[Callable[..., Demo]]:
    """``toy_demo(prefix, **config)``: a running toy demo stack; stopped and checked at the end of the test."""
    started: list[tuple[Demo, Path]] = []

    def start(prefix: str, hosts: Mapping[str, Host] | None = None, **config: Any) -> Demo:
        # Not pytest's tmp_path: /tmp/pytest-of-<user> is 0700, and the scorer's sandbox runs each grading job as an
        # unprivileged uid that must be able to reach its work directory under the run directory.
        run_dir = Path(tempfile.mkdtemp(prefix=prefix))
        run_dir.chmod(0o755)
        config = {"dashboard": False, **config}
        cfg = DemoConfig.for_model(
            "tiny", steps=1000, group_size=4, groups_per_step=2, run_dir=run_dir, timeout_s=600, **config
        )  # fmt: skip
        rollout = {
            "FLOE_ROLLOUT_GROUP_DEADLINE_S": str(GROUP_DEADLINE_S),
            "FLOE_ROLLOUT_CANCEL_GRACE_S": str(CANCEL_GRACE_S),
        }
        d = Demo(
            cfg, env_overrides={name: rollout for name in Demo.instance_names("rollout", cfg.rollouts)}, hosts=hosts
        )
        d.passed = False  # type: ignore[attr-defined]
        started.append((d, run_dir))
        d.up()
        return d

    try:
        yield start
    finally:
        for d, _ in started:
            d.down()
    for d, run_dir in started:
        # Nodes were killed mid-session and stopped while starting sessions: no sandbox may outlive them.
        leftovers = subprocess.run(
            ["pgrep", "-a", "-f", f"{run_dir}|{d.sandbox_root}"], capture_output=True, text=True
        ).stdout.splitlines()
        assert not leftovers, "processes of the run survived:\n" + "\n".join(leftovers)
        if d.passed and not os.environ.get("FLOE_E2E_KEEP"):  # type: ignore[attr-defined]
            shutil.rmtree(run_dir, ignore_errors=True)
        else:
            print(f"run directory kept: {run_dir}")


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
