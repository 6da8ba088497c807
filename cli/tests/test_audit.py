"""``floe audit`` against a real broker: each broken promise is named, and a live run is not mistaken for a broken one.

Each test gets a broker of its own: the audit reads the production topic names, which other tests on the shared
session broker also write.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contracts import (
    REWARDS,
    SESSIONS_FINISHED,
    SESSIONS_REQUESTED,
    TRAJECTORY_BATCHES,
    WEIGHTS,
    Event,
    Outcome,
    RewardPublished,
    SessionFinished,
    SessionRequested,
    SessionState,
    Topic,
    TrajectoryBatch,
    TrajectoryRow,
    WeightsPublished,
    to_ipc,
)
from eventbus import KafkaSettings, Producer, ensure_topics
from eventbus.broker import LocalBroker, free_ports
from floe import audit as audit_module
from floe.audit import audit

pytestmark = pytest.mark.integration

TOPICS: list[Topic[Any]] = [SESSIONS_REQUESTED, SESSIONS_FINISHED, REWARDS, TRAJECTORY_BATCHES, WEIGHTS]


@pytest.fixture
def own_kafka(tmp_path: Path) -> Iterator[KafkaSettings]:
    broker = LocalBroker.at(tmp_path / "kafka")
    address = broker.start(*free_ports(2), owner_pid=os.getpid())
    try:
        settings = KafkaSettings(bootstrap_servers=address)
        asyncio.run(ensure_topics(settings, [*TOPICS, audit_module.SESSIONS_CANCEL]))
        yield settings
    finally:
        broker.stop(timeout_s=10)


def publish(settings: KafkaSettings, events: list[tuple[Topic[Any], Event]]) -> None:
    async def send() -> None:
        async with Producer(settings) as producer:
            for topic, event in events:
                await producer.send(topic, event)

    asyncio.run(send())


def session(sid: str, gid: str, reward: float = 0.5) -> list[tuple[Topic[Any], Event]]:
    """One session's life in causal order: requested, finished, rewarded."""
    common = {"session_id": sid, "group_id": gid, "task_id": "t"}
    return [
        (SESSIONS_REQUESTED, SessionRequested(**common, harness="toy")),
        (SESSIONS_FINISHED, SessionFinished(**common, harness="toy", node_id="n", status=SessionState.DONE)),
        (REWARDS, RewardPublished(**common, reward=reward, outcome=Outcome.UNRESOLVED, resolved=False)),
    ]


def batch(batch_id: str, rows: list[tuple[str, str]]) -> TrajectoryBatch:
    table = [
        TrajectoryRow(
            session_id=sid,
            group_id=gid,
            task_id="t",
            harness="toy",
            builder="prefix_merging",
            trace_index=0,
            num_traces=1,
            prompt_len=2,
            tokens=(1, 2, 3, 4),
            loss_mask=(0, 0, 1, 1),
            logprobs=(0.0, 0.0, -0.5, -0.5),
            weight_versions=(-1, -1, 1, 1),
            reward=0.5,
            advantage=0.0,
            session_weight=1.0,
            status="DONE",
        )
        for sid, gid in rows
    ]
    ipc = to_ipc(table)
    return TrajectoryBatch(
        batch_id=batch_id,
        step=0,
        num_rows=len(rows),
        num_groups=len({g for _, g in rows}),
        num_sessions=len({s for s, _ in rows}),
        builder="prefix_merging",
        min_weight_version=1,
        max_weight_version=1,
        size_bytes=len(ipc),
        arrow_ipc=ipc,
    )


def weights(version: int, batch_id: str) -> WeightsPublished:
    return WeightsPublished(version=version, uri=f"/ckpt/v{version}", step=version, batch_id=batch_id)


def test_every_broken_promise_is_named(own_kafka: KafkaSettings) -> None:
    events: list[tuple[Topic[Any], Event]] = []
    for i in range(4):
        events += session(f"a-{i}", "ga")
    events += session("b-0", "gb")[:2]  # finished, then rewarded twice with different values
    events += [(REWARDS, session("b-0", "gb", reward=0.1)[2][1]), (REWARDS, session("b-0", "gb", reward=0.9)[2][1])]
    events += [(REWARDS, session("ghost", "gb")[2][1])]  # a reward for a session that never finished
    events += [
        (TRAJECTORY_BATCHES, batch("b1", [("a-0", "ga"), ("a-1", "ga"), ("a-2", "ga")])),  # a-3 lost
        (TRAJECTORY_BATCHES, batch("b2", [("b-0", "gb"), ("a-2", "ga")])),  # a-2 again
        (WEIGHTS, weights(1, "b1")),
        (WEIGHTS, weights(3, "b1")),  # trained twice, and version 2 never published
    ]
    publish(own_kafka, events)

    report = audit(own_kafka, idle_timeout=2.0)

    found = "\n".join(report.violations)
    for expected in (
        "session b-0: 2 RewardPublished (conflicting values)",
        "reward for session ghost that has no SessionFinished",
        "group ga: session(s) ['a-3'] missing from its batch (lost trajectory)",
        "session a-2 in 2 batches",
        "group ga split over batches ['b1', 'b2']",
        "weight versions not consecutive: missing [2]",
        "batch b1 trained twice: versions [1, 3]",
    ):
        assert expected in found, f"{expected!r} not among:\n{found}"
    assert not report.ok


def test_events_published_while_the_audit_reads_are_not_violations(
    own_kafka: KafkaSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    history: list[tuple[Topic[Any], Event]] = []
    for i in range(4):
        history += session(f"a-{i}", "ga")
    history += [(TRAJECTORY_BATCHES, batch("b1", [(f"a-{i}", "ga") for i in range(4)])), (WEIGHTS, weights(1, "b1"))]
    publish(own_kafka, history)

    # The run goes on while the audit reads: after each topic is read, another session finishes and is rewarded.
    read = audit_module._events
    live = iter(range(100))

    def read_then_publish(*args: Any) -> Any:
        events = read(*args)
        publish(own_kafka, session(f"live-{next(live)}", "g-live"))
        return events

    monkeypatch.setattr(audit_module, "_events", read_then_publish)
    report = audit(own_kafka, idle_timeout=2.0)

    assert report.ok, report.violations
    assert next(live) == 6, "the audit should have read six topics"
    assert report.counts["sessions rewarded"] >= 4 and report.versions == [1]
