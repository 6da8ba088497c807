"""floe against real brokers: `kafka up/status/down` lifecycle (its own broker), `topics`, `replay`."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from contracts import REWARDS, TOPICS, Outcome, RewardPublished, Topic
from eventbus import Consumer, KafkaSettings, Producer
from eventbus.broker import free_port
from floe.cli import main

pytestmark = pytest.mark.integration


def floe(*args: str, env: dict[str, str] | None = None, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """Run the real console entry point in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "floe", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: existence check only
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
def test_kafka_up_status_down_is_idempotent_and_leaves_no_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = str(tmp_path / "home")
    pid_file = tmp_path / "home" / "kafka" / "kafka.pid"
    port = free_port()

    def floe_in_process(*args: str) -> tuple[int, str, str]:
        # A subprocess too: the broker's owner watchdog and signal handlers are per process, and this test's broker
        # must not be tied to the pytest process that also owns the session broker of later tests.
        proc = floe("--state-dir", home, *args)
        return proc.returncode, proc.stdout, proc.stderr

    # The real console entry point, in a subprocess, for the first start.
    started = time.monotonic()
    up = floe("kafka", "up", "--state-dir", home, "--port", str(port), "--controller-port", str(free_port()))
    cold_s = time.monotonic() - started
    assert up.returncode == 0, up.stderr
    assert up.stdout.strip() == f"127.0.0.1:{port}"
    pid = int(pid_file.read_text())
    assert alive(pid)
    try:
        rc, out, err = floe_in_process("kafka", "up")
        assert rc == 0 and out.strip() == f"127.0.0.1:{port}" and "already running" in err
        rc, out, _ = floe_in_process("kafka", "status")
        assert rc == 0 and f"pid={pid}" in out
        rc, out, err = floe_in_process("topics", "create")
        assert rc == 0, err
        rc, out, err = floe_in_process("topics", "describe")
        assert rc == 0, err
        for topic in TOPICS:
            assert topic.name in out
        rc, out, _ = floe_in_process("kafka", "logs", "-n", "500")
        assert rc == 0 and "Kafka Server started" in out
    finally:
        rc, _, _ = floe_in_process("kafka", "down")
    assert rc == 0
    assert not alive(pid), "broker process survived `floe kafka down`"
    assert floe_in_process("kafka", "status")[0] == 3
    assert floe_in_process("kafka", "down")[0] == 0  # idempotent
    # Warm restart on the same state: the data (topics) survive, the address is the same.
    warm_started = time.monotonic()
    rc, out, err = floe_in_process("kafka", "up")
    warm_s = time.monotonic() - warm_started
    pid2 = int(pid_file.read_text())
    try:
        assert rc == 0 and out.strip() == f"127.0.0.1:{port}", err
        rc, out, _ = floe_in_process("topics", "list")
        assert {t.name for t in TOPICS} <= set(out.split())
    finally:
        down = floe("kafka", "down", "--state-dir", home)
    assert down.returncode == 0, down.stderr
    assert not alive(pid2)
    print(f"\nfloe kafka up: cold {cold_s:.1f}s (incl. interpreter start), warm {warm_s:.1f}s")


def _reward(i: int) -> RewardPublished:
    return RewardPublished(
        session_id=f"s-{i:03d}", group_id="g", task_id="t", reward=i / 100, outcome=Outcome.RESOLVED, resolved=True
    )


def test_replay_prints_decoded_events_by_offset_time_and_partition(
    kafka_settings: KafkaSettings,
    topic_factory: Callable[..., Topic[Any]],
    consumer_group: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    # Sync test: `floe replay --into` runs its own event loop (asyncio.run), as it does from a shell.
    topic = topic_factory(REWARDS, partitions=2)
    bs = kafka_settings.bootstrap_servers

    async def produce() -> datetime:
        async with Producer(kafka_settings) as producer:
            first = [await producer.send(topic, _reward(i), partition=0) for i in range(4)]
            await asyncio.sleep(0.05)
            cut = datetime.now(UTC)
            await asyncio.sleep(0.05)
            later = [await producer.send(topic, _reward(i), partition=0) for i in range(4, 6)]
            await producer.send(topic, _reward(99), partition=1)
        assert [d.offset for d in first + later] == list(range(6))
        return cut

    cut = asyncio.run(produce())
    part = 0

    def run(*extra: str) -> list[dict[str, Any]]:
        capsys.readouterr()  # drop library log lines printed so far
        assert main(["replay", "--topic", topic.name, "--bootstrap", bs, *extra]) == 0
        return [json.loads(line) for line in capsys.readouterr().out.splitlines()]

    everything = run()
    assert sorted(r["event"]["session_id"] for r in everything) == [f"s-{i:03d}" for i in (*range(6), 99)]
    assert all(r["event_type"] == "RewardPublished" and r["topic"] == topic.name for r in everything)

    by_offset = run("--partition", str(part), "--from", "1", "--to", "3")
    assert [(r["offset"], r["event"]["session_id"]) for r in by_offset] == [(1, "s-001"), (2, "s-002")]

    by_time = run("--partition", str(part), "--from", cut.isoformat())
    assert [r["event"]["session_id"] for r in by_time] == ["s-004", "s-005"]

    out = tmp_path / "r.jsonl"
    assert main(["replay", "--topic", topic.name, "--bootstrap", bs, "--jsonl", str(out), "--to", cut.isoformat()]) == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert sorted(r["event"]["session_id"] for r in lines) == ["s-000", "s-001", "s-002", "s-003"]

    into = topic.name + ".replayed"
    assert main(["replay", "--topic", topic.name, "--bootstrap", bs, "--into", into, "--partition", str(part)]) == 0

    async def consume() -> list[str]:
        async with Consumer(kafka_settings, [REWARDS.with_name(into)], group_id=consumer_group) as consumer:
            got = []
            while (msg := await consumer.next(timeout_s=2.0)) is not None:
                got.append(msg.event.session_id)
            return got

    assert sorted(asyncio.run(consume())) == [f"s-{i:03d}" for i in range(6)]


def test_topics_create_sizes_the_session_keyed_topics_and_never_repartitions(
    kafka_settings: KafkaSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    tag = uuid.uuid4().hex[:10]
    calls, batches = f"floe.model-calls.{tag}", f"floe.trajectory-batches.{tag}"
    boot = ["topics", "--bootstrap", kafka_settings.bootstrap_servers]
    assert main([*boot, "create", "--partitions", "12", calls, batches]) == 0
    out = capsys.readouterr().out
    assert f"{calls}\tcreated\t12 partitions" in out
    assert f"{batches}\tcreated\t1 partitions" in out  # the learner reads batches in order: one partition
    assert main([*boot, "describe", "--json", calls, batches]) == 0
    rows = {r["topic"]: r["partitions"] for r in map(json.loads, capsys.readouterr().out.splitlines())}
    assert rows == {calls: 12, batches: 1}
    # The same count again is fine; another count is refused and changes nothing.
    assert main([*boot, "create", "--partitions", "12", calls]) == 0
    assert f"{calls}\texists\t12 partitions" in capsys.readouterr().out
    assert main([*boot, "create", "--partitions", "16", calls]) == 1
    assert "exists with 12 partitions, not 16" in capsys.readouterr().err
    assert main([*boot, "create", calls]) == 0  # without --partitions an existing topic is taken as it is
    assert main([*boot, "describe", "--json", calls]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["partitions"] == 12
    assert main([*boot, "create", "--partitions", "0", calls]) == 2
    assert main([*boot, "create", "floe.nope"]) == 2


def test_topics_describe_against_the_session_broker(
    kafka_settings: KafkaSettings, topic_factory: Callable[..., Topic[Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    topic = topic_factory(REWARDS, partitions=3)
    assert main(["topics", "--bootstrap", kafka_settings.bootstrap_servers, "describe", "--json", topic.name]) == 0
    (row,) = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert row["topic"] == topic.name and row["partitions"] == 3 and row["messages"] == 0
    assert row["config"]["retention.ms"] == str(REWARDS.retention_ms)
    assert main(["topics", "--bootstrap", kafka_settings.bootstrap_servers, "describe", "nope.missing"]) == 1
    assert "UNKNOWN_TOPIC_OR_PART" in capsys.readouterr().err
