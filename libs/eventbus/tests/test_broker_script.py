"""deploy/kafka/kafka.sh: signals only its own broker, clear usage errors, and the owner watchdog."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from eventbus.broker import BrokerError, LocalBroker, find_kafka_sh, free_ports, wait_gone

SCRIPT = find_kafka_sh()


def sh(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})}
    )


def test_a_recorded_pid_that_is_not_our_broker_is_never_signalled(tmp_path: Path) -> None:
    # A stale pid file naming a live, unrelated process (pid reuse): status says stopped and stop leaves it alone.
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        (tmp_path / "kafka.pid").write_text(str(bystander.pid))
        status = sh("status", "--state-dir", str(tmp_path))
        assert status.returncode == 3 and status.stdout.startswith("stopped")
        stop = sh("stop", "--state-dir", str(tmp_path))
        assert stop.returncode == 0 and "not running" in stop.stderr
        time.sleep(0.2)
        assert bystander.poll() is None, "kafka.sh signalled a process that is not its broker"
    finally:
        bystander.kill()
        bystander.wait()


def test_the_listener_and_the_controller_get_two_ports(tmp_path: Path) -> None:
    # Two free_port() calls in a row once returned one port, and the broker refused to format (a CI run).
    ports = free_ports(2)
    assert ports[0] != ports[1]
    with pytest.raises(BrokerError, match="two ports"):
        LocalBroker.at(tmp_path).start(ports[0], ports[0])


def test_usage_errors_are_clear(tmp_path: Path) -> None:
    bad = sh("explode")
    assert bad.returncode == 1 and "unknown command 'explode'" in bad.stderr
    opt = sh("status", "--colour", "red")
    assert opt.returncode == 1 and "unknown option '--colour'" in opt.stderr
    nojava = sh("start", "--state-dir", str(tmp_path), env={"FLOE_JAVA": str(tmp_path / "nope")})
    assert nojava.returncode == 1 and "java not found" in nojava.stderr and "openjdk-17" in nojava.stderr
    logs = sh("logs", "--state-dir", str(tmp_path))
    assert logs.returncode == 1 and "no broker log" in logs.stderr


@pytest.mark.integration
@pytest.mark.slow
def test_broker_stops_itself_when_its_owner_dies(tmp_path: Path) -> None:
    owner = subprocess.Popen(["sleep", "600"])
    broker = LocalBroker.at(tmp_path / "state")
    try:
        broker.start(*free_ports(2), owner_pid=owner.pid, ready_timeout_s=120)
        pid = broker.pid()
        assert pid is not None
        owner.kill()  # the "pytest" that owned the broker dies without any teardown
        owner.wait()
        assert wait_gone(pid, timeout_s=60), "broker outlived its owner"
        assert broker.status() is None
    finally:
        if owner.poll() is None:
            owner.kill()
        broker.stop()


def _running_with(text: str) -> list[str]:
    """Command lines of live processes that mention ``text`` (pgrep -f, but showing what matched)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{entry.name}: {cmdline}")
    return found


@pytest.mark.integration
@pytest.mark.slow
def test_stop_returns_with_nothing_of_the_broker_left_running(tmp_path: Path) -> None:
    # With an owner, start also leaves a watchdog loop behind; `stop` must end it too, not leave it to notice on its
    # own a second later (a caller that checks for leftovers right after stop would see it).
    state = tmp_path / "state"
    broker = LocalBroker.at(state)
    try:
        broker.start(*free_ports(2), owner_pid=os.getpid(), ready_timeout_s=120)
        assert any("floe-kafka-watchdog" in line for line in _running_with(str(state))), "no watchdog started"
    finally:
        broker.stop()
    assert _running_with(str(state)) == []


@pytest.mark.integration
@pytest.mark.slow
def test_a_restart_keeps_the_previous_runs_log_with_its_shutdown(tmp_path: Path) -> None:
    # What a restart leaves behind (a hung transaction, say) is decided during the shutdown before it: that log must
    # survive the next start.
    broker = LocalBroker.at(tmp_path / "state")
    ports = free_ports(2)
    try:
        broker.start(*ports, owner_pid=os.getpid(), ready_timeout_s=120)
        broker.stop()
        broker.start(*ports, owner_pid=os.getpid(), ready_timeout_s=120)
        previous = (tmp_path / "state" / "broker.log.1").read_text()
        current = broker.log_path.read_text()
        assert "Kafka Server started" in previous and "SIGTERM" in previous
        assert "Kafka Server started" in current and "SIGTERM" not in current
    finally:
        broker.stop()
