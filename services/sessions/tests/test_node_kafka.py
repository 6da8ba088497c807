"""The node over a real broker: requests in, lifecycle and results out, cancels from the cancel topic, duplicates
ignored. Topics are uuid copies made by ``topic_factory``; the gateway is the real app (scripted fake engine)."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest

from contracts import (
    SESSIONS_CANCEL,
    SESSIONS_FINISHED,
    SESSIONS_REQUESTED,
    SESSIONS_STATE,
    SessionCancelRequested,
    SessionFinished,
    SessionState,
    SessionStateChanged,
    Topic,
)
from eventbus import Consumer, KafkaSettings, Producer
from sessions.node import NodeTopics, SessionNode
from sessions.settings import SessionSettings

from .conftest import GatewayUnderTest, LocalTaskSet, request

pytestmark = pytest.mark.integration


class Observed:
    def __init__(self) -> None:
        self.states: dict[str, list[SessionStateChanged]] = {}
        self.finished: dict[str, list[SessionFinished]] = {}

    async def pump(self, consumer: Consumer[Any]) -> None:
        async for msg in consumer:
            event = msg.event
            if isinstance(event, SessionStateChanged):
                self.states.setdefault(event.session_id, []).append(event)
            elif isinstance(event, SessionFinished):
                self.finished.setdefault(event.session_id, []).append(event)

    async def until(self, predicate: Any, timeout: float = 60.0) -> None:
        deadline = asyncio.get_running_loop().time() + timeout
        while not predicate():
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"condition not met in {timeout}s; states={self.states}")
            await asyncio.sleep(0.05)

    def path(self, sid: str) -> list[str]:
        return [e.state.value for e in self.states.get(sid, [])]


@pytest.fixture
async def running_node(
    settings: SessionSettings,
    kafka_settings: KafkaSettings,
    topic_factory: Any,
    consumer_group: str,
    gateway: GatewayUnderTest,
) -> AsyncIterator[tuple[SessionNode, NodeTopics, Producer, Observed]]:
    topics = NodeTopics(
        requested=topic_factory(SESSIONS_REQUESTED, partitions=1),
        cancel=topic_factory(SESSIONS_CANCEL),
        state=topic_factory(SESSIONS_STATE),
        finished=topic_factory(SESSIONS_FINISHED),
    )
    node = SessionNode(settings, kafka_settings, gateway.link, topics=topics, group_id=consumer_group)
    observed = Observed()
    observed_topics: list[Topic[Any]] = [topics.state, topics.finished]
    async with (
        Producer(kafka_settings) as producer,
        Consumer[Any](kafka_settings, observed_topics, group_id=consumer_group + "-obs") as consumer,
    ):
        node_task = asyncio.create_task(node.run())
        pump = asyncio.create_task(observed.pump(consumer))
        await asyncio.wait_for(node.started.wait(), 30)
        try:
            yield node, topics, producer, observed
        finally:
            node_task.cancel()
            pump.cancel()
            await asyncio.gather(node_task, pump, return_exceptions=True)


async def test_request_to_done_over_kafka_and_duplicate_ignored(
    running_node: tuple[SessionNode, NodeTopics, Producer, Observed], taskset: LocalTaskSet
) -> None:
    node, topics, producer, seen = running_node
    req = request(taskset, metadata={"command": "sed -i 's/a - b/a + b/' app.py"})
    await producer.send(topics.requested, req)
    await seen.until(lambda: req.session_id in seen.finished)
    (finished,) = seen.finished[req.session_id]
    assert finished.status is SessionState.DONE, finished.reason
    assert "+    return a + b" in finished.diff and finished.node_id == "test-node"
    assert seen.path(req.session_id) == ["REQUESTED", "PREPARING", "READY", "RUNNING", "FINISHING", "DONE"]
    assert [e.seq for e in seen.states[req.session_id]] == list(range(6))

    # Redelivery: the same request again, then a sentinel on the same (single) partition. Once the sentinel is
    # done, the duplicate has been read and ignored: still one result, one REQUESTED.
    sentinel = request(taskset, metadata={"command": "true"})
    await producer.send(topics.requested, req)
    await producer.send(topics.requested, sentinel)
    await seen.until(lambda: sentinel.session_id in seen.finished)
    assert len(seen.finished[req.session_id]) == 1
    assert seen.path(req.session_id).count("REQUESTED") == 1
    assert node.metrics.duplicates._value.get() == 1


async def test_cancel_topic_stops_a_running_session(
    running_node: tuple[SessionNode, NodeTopics, Producer, Observed], taskset: LocalTaskSet
) -> None:
    node, topics, producer, seen = running_node
    req = request(taskset, metadata={"command": "sleep 600"})
    await producer.send(topics.requested, req)
    await seen.until(lambda: "RUNNING" in seen.path(req.session_id))
    await producer.send(topics.cancel, SessionCancelRequested(session_id=req.session_id, reason="group deadline"))
    await seen.until(lambda: req.session_id in seen.finished, timeout=30)
    finished = seen.finished[req.session_id][0]
    assert finished.status is SessionState.CANCELLED and finished.reason == "group deadline"
    assert seen.path(req.session_id)[-1] == "CANCELLED"
    assert not node.active


async def test_cancel_before_request_over_kafka(
    running_node: tuple[SessionNode, NodeTopics, Producer, Observed], taskset: LocalTaskSet
) -> None:
    node, topics, producer, seen = running_node
    sid = "s-early-" + secrets.token_hex(4)
    await producer.send(topics.cancel, SessionCancelRequested(session_id=sid, reason="not needed"))
    # The cancel and request topics are independent: wait until the node has read the cancel.
    await seen.until(lambda: sid in node._early_cancels, timeout=30)
    await producer.send(topics.requested, request(taskset, session_id=sid, metadata={"command": "true"}))
    await seen.until(lambda: sid in seen.finished)
    assert seen.path(sid) == ["REQUESTED", "CANCELLED"]
