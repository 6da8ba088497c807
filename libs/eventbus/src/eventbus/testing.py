"""pytest plugin (``-p eventbus.testing``): ONE real Kafka broker per test session, shared by every test.

Fixtures:

- ``kafka_broker`` (session): starts ``deploy/kafka/kafka.sh`` on two free ports with a temporary state dir, the
  first time a test asks for a Kafka fixture (unit-only runs never pay for it), and stops it by pid at session end.
- ``kafka_settings`` (session): ``KafkaSettings`` pointing at that broker.
- ``topic_factory`` (function): ``topic_factory(contracts.MODEL_CALLS)`` creates a uuid-suffixed copy of the
  registry topic on the broker and returns the new ``Topic``.
- ``consumer_group`` (function): a fresh uuid group id.

Tests that use these fixtures are marked ``integration`` automatically, so ``-m "not integration"`` never starts
the broker. If the broker cannot start, every test that needs it ERRORS with the cause, the fix and the broker log
path: integration tests are never skipped.

``FLOE_TEST_KAFKA_BOOTSTRAP=host:port`` makes the session use an already running broker instead (e.g. one from
``floe kafka up``), which saves the start-up on a busy machine; the run still fails if it does not answer.
``FLOE_TEST_KAFKA_START_TIMEOUT`` (seconds) overrides the readiness deadlines (90 s local, 15 s external).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest

from contracts import WEIGHTS, Topic, WeightsPublished
from eventbus.admin import ensure_topics_sync, wait_for_broker
from eventbus.broker import BrokerError, LocalBroker, free_ports
from eventbus.replay import replay
from eventbus.settings import KafkaSettings

__all__ = ["KAFKA_FIXTURES", "BrokerHandle", "newest_weight_version"]

KAFKA_FIXTURES = frozenset({"kafka_broker", "kafka_settings", "topic_factory", "consumer_group"})


@dataclass(frozen=True)
class BrokerHandle:
    bootstrap_servers: str
    state_dir: Path | None  # None for an external broker
    log_path: Path | None
    started_in_s: float


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Runs before `-m` deselection, so `-m "not integration"` also drops tests that only use our fixtures.
    for item in items:
        if KAFKA_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


_started: list[BrokerHandle] = []


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for handle in _started:
        where = "external" if handle.state_dir is None else "started"
        terminalreporter.write_line(
            f"kafka test broker: {where} at {handle.bootstrap_servers}, ready in {handle.started_in_s:.1f}s"
        )


def pytest_configure(config: pytest.Config) -> None:
    # Registered here too, so the plugin works in any project (and under --strict-markers).
    config.addinivalue_line("markers", "integration: needs the real Kafka broker (started once per test session)")


def _fail(cause: str, log_path: Path | None, log_tail: str = "") -> NoReturn:
    lines = [
        "Kafka test broker could not start (integration tests need a real broker; they are never skipped).",
        f"  cause: {cause}",
        "  fix:   bash deploy/kafka/kafka.sh jars",
        "         (needs Java 17+ and Maven: apt-get install -y openjdk-17-jre-headless maven)",
        "         or run only unit tests: pytest -m 'not integration'",
    ]
    if log_path is not None:
        lines.append(f"  broker log: {log_path}")
    if log_tail:
        lines.append("  last log lines:\n" + "\n".join("    " + line for line in log_tail.splitlines()))
    pytest.fail("\n".join(lines), pytrace=False)


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[BrokerHandle]:
    started = time.monotonic()
    external = os.environ.get("FLOE_TEST_KAFKA_BOOTSTRAP")
    if external:
        problem = _check_external(external)
        if problem is not None:
            _fail(problem, None)
        handle = BrokerHandle(external, None, None, time.monotonic() - started)
        _started.append(handle)
        yield handle
        return

    # A short path outside pytest's tmp tree: kept when the start fails, so the log can be read afterwards.
    state_dir = Path(tempfile.mkdtemp(prefix="floe-kafka-test-"))
    broker, address, problem = _start(state_dir)
    if problem is not None or broker is None:
        log_path = broker.log_path if broker is not None and broker.log_path.is_file() else None
        tail = broker.log_tail() if broker is not None and log_path is not None else ""
        if log_path is None:
            shutil.rmtree(state_dir, ignore_errors=True)  # nothing worth keeping
        # Failing outside any `except` keeps the report to our one clear message (no chained tracebacks).
        _fail(problem or "unknown", log_path, tail)
    handle = BrokerHandle(address, state_dir, broker.log_path, time.monotonic() - started)
    _started.append(handle)
    try:
        yield handle
    finally:
        broker.stop(timeout_s=30)
        shutil.rmtree(state_dir, ignore_errors=True)


def _timeout(default: float) -> float:
    value = os.environ.get("FLOE_TEST_KAFKA_START_TIMEOUT")
    return float(value) if value else default


def _check_external(address: str) -> str | None:
    try:
        wait_for_broker(KafkaSettings(bootstrap_servers=address), timeout_s=_timeout(15.0))
    except Exception as exc:
        return f"FLOE_TEST_KAFKA_BOOTSTRAP={address} does not answer: {exc}"
    return None


def _start(state_dir: Path) -> tuple[LocalBroker | None, str, str | None]:
    """(broker, address, None) once ready, or (broker or None, "", why it failed) with nothing left running."""
    try:
        broker = LocalBroker.at(state_dir)
    except BrokerError as exc:
        return None, "", str(exc)
    try:
        # owner_pid: kafka.sh's watchdog stops the broker if this pytest process dies without tearing down.
        address = broker.start(*free_ports(2), owner_pid=os.getpid(), ready_timeout_s=_timeout(90.0))
        wait_for_broker(KafkaSettings(bootstrap_servers=address), timeout_s=_timeout(30.0))
    except Exception as exc:
        _stop_quietly(broker)
        return broker, "", str(exc)
    return broker, address, None


def _stop_quietly(broker: LocalBroker) -> None:
    with contextlib.suppress(BrokerError):
        broker.stop(timeout_s=10)


@pytest.fixture(scope="session")
def kafka_settings(kafka_broker: BrokerHandle) -> KafkaSettings:
    return KafkaSettings(bootstrap_servers=kafka_broker.bootstrap_servers, client_id="floe-test")


@pytest.fixture
def topic_factory(kafka_settings: KafkaSettings) -> Callable[..., Topic[Any]]:
    def make(topic: Topic[Any], partitions: int | None = None) -> Topic[Any]:
        copy = topic.with_name(f"{topic.name}.t-{uuid.uuid4().hex[:12]}")
        if partitions is not None:
            copy = _with_partitions(copy, partitions)
        ensure_topics_sync(kafka_settings, [copy])
        return copy

    return make


def _with_partitions(topic: Topic[Any], partitions: int) -> Topic[Any]:
    from dataclasses import replace

    return replace(topic, partitions=partitions)


@pytest.fixture
def consumer_group() -> str:
    return f"g-{uuid.uuid4().hex}"


def newest_weight_version(kafka: KafkaSettings, *, idle_timeout_s: float = 3.0) -> int:
    """The newest version on ``floe.weights`` (0 if none yet): what end-to-end tests wait on to see training advance."""
    newest = 0
    for record in replay(kafka, WEIGHTS, idle_timeout_s=idle_timeout_s):
        if isinstance(record.event, WeightsPublished):
            newest = max(newest, record.event.version)
    return newest
