"""Producer -> real broker -> Consumer: every contract event, a multi-MB Arrow batch, size limits, commits."""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

from contracts import (
    MODEL_CALLS,
    REWARDS,
    TOPICS,
    TRAJECTORY_BATCHES,
    Event,
    Outcome,
    RewardPublished,
    Topic,
    TrajectoryBatch,
    TrajectoryRow,
    read_ipc,
    to_ipc,
    trajectory_table,
)
from eventbus import Consumer, KafkaSettings, MessageTooLarge, Producer, SerializationFailed
from eventbus.metrics import new_registry
from eventbus.replay import replay

pytestmark = pytest.mark.integration

TopicFactory = Callable[..., Topic[Any]]


async def drain(consumer: Consumer[Any], n: int, timeout_s: float = 30.0) -> list[Any]:
    """Collect ``n`` messages or fail at the deadline (never waits longer than needed)."""
    import time

    got: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n:
        left = deadline - time.monotonic()
        assert left > 0, f"only {len(got)} of {n} messages within {timeout_s}s"
        msg = await consumer.next(timeout_s=left)
        if msg is not None:
            got.append(msg)
    return got


async def test_every_contract_event_round_trips(
    kafka_settings: KafkaSettings, topic_factory: TopicFactory, consumer_group: str, golden_events: dict[str, Event]
) -> None:
    copies = {t.name: topic_factory(t, partitions=1) for t in TOPICS}
    async with Producer(kafka_settings) as producer:
        for name, topic in copies.items():
            delivery = await producer.send(topic, golden_events[name])
            assert delivery.topic == topic.name and delivery.offset == 0
    async with Consumer(kafka_settings, list(copies.values()), group_id=consumer_group) as consumer:
        messages = await drain(consumer, len(copies))
    by_topic = {m.topic: m for m in messages}
    assert set(by_topic) == {t.name for t in copies.values()}
    for name, topic in copies.items():
        msg = by_topic[topic.name]
        sent = golden_events[name]
        assert type(msg.event) is topic.model
        assert msg.event == sent
        assert msg.key == topic.key_of(sent).decode()
        assert msg.headers["floe-event"] == type(sent).__name__.encode()


def _big_table(rows: int, tokens: int) -> pa.Table:
    # Random token ids and logprobs: they barely compress, so the message really is several MB.
    rng = random.Random(7)
    data = []
    for i in range(rows):
        ids = tuple(rng.getrandbits(24) for _ in range(tokens))
        data.append(
            TrajectoryRow(
                session_id=f"s-{i}",
                group_id=f"g-{i // 8}",
                task_id="task",
                harness="pi",
                builder="per_request",
                trace_index=0,
                num_traces=1,
                prompt_len=tokens // 2,
                tokens=ids,
                loss_mask=(0,) * (tokens // 2) + (1,) * (tokens - tokens // 2),
                logprobs=tuple(-(x % 1000) / 100.0 for x in ids),
                weight_versions=(3,) * tokens,
                reward=1.0,
                advantage=0.5,
                session_weight=1.0,
                status="DONE",
            )
        )
    return trajectory_table(data)


async def test_each_acked_send_is_counted_under_its_topic(
    kafka_settings: KafkaSettings, topic_factory: TopicFactory, golden_events: dict[str, Event]
) -> None:
    reg = new_registry()
    # Two topics through one producer: each count lands under its own topic (the children are looked up once each).
    sent: list[tuple[Topic[Any], Topic[Any], int]] = [
        (topic_factory(MODEL_CALLS, partitions=1), MODEL_CALLS, 3),
        (topic_factory(REWARDS, partitions=1), REWARDS, 1),
    ]
    async with Producer(kafka_settings, registry=reg) as producer:
        for topic, registered, n in sent:
            for _ in range(n):
                await producer.send(topic, golden_events[registered.name])
    for topic, _, n in sent:
        assert reg.get_sample_value("floe_eventbus_produced_total", {"topic": topic.name}) == n
        assert reg.get_sample_value("floe_eventbus_produce_seconds_count", {"topic": topic.name}) == n


async def test_multi_megabyte_arrow_batch_travels_inline(
    kafka_settings: KafkaSettings, topic_factory: TopicFactory, consumer_group: str
) -> None:
    table = _big_table(rows=64, tokens=16384)
    ipc = to_ipc(table)
    assert len(ipc) > 4 * 1024 * 1024, len(ipc)
    batch = TrajectoryBatch(
        batch_id="b-big",
        step=7,
        num_rows=table.num_rows,
        num_groups=8,
        num_sessions=64,
        builder="per_request",
        min_weight_version=3,
        max_weight_version=3,
        size_bytes=len(ipc),
        arrow_ipc=ipc,
    )
    topic = topic_factory(TRAJECTORY_BATCHES)
    async with Producer(kafka_settings) as producer:
        await producer.send(topic, batch)
    async with Consumer(kafka_settings, [topic], group_id=consumer_group) as consumer:
        (msg,) = await drain(consumer, 1)
    got = msg.event
    assert isinstance(got, TrajectoryBatch) and got.batch_id == "b-big" and got.size_bytes == len(ipc)
    assert got.arrow_ipc is not None and bytes(got.arrow_ipc) == ipc
    assert read_ipc(got.arrow_ipc).equals(table)
    # The group-less replay reads it too, and reports the inline Arrow size instead of dumping it into JSON.
    (record,) = list(replay(kafka_settings, topic))
    assert record.as_json()["arrow_ipc_bytes"] == len(ipc) and record.as_json()["event"]["batch_id"] == "b-big"


async def test_message_over_the_topic_limit_is_rejected_with_our_error(
    kafka_settings: KafkaSettings, topic_factory: TopicFactory
) -> None:
    topic = topic_factory(TRAJECTORY_BATCHES)  # max.message.bytes = 16 MiB
    blob = os.urandom(17 * 1024 * 1024)
    batch = TrajectoryBatch(
        batch_id="b-huge",
        step=0,
        num_rows=1,
        num_groups=1,
        num_sessions=1,
        builder="x",
        min_weight_version=0,
        max_weight_version=0,
        size_bytes=len(blob),
        arrow_ipc=blob,
    )
    async with Producer(kafka_settings) as producer:
        with pytest.raises(MessageTooLarge):
            await producer.send(topic, batch)


async def test_wrong_event_type_for_topic_is_a_serialization_error(
    kafka_settings: KafkaSettings, topic_factory: TopicFactory, golden_events: dict[str, Event]
) -> None:
    topic = topic_factory(MODEL_CALLS, partitions=1)
    async with Producer(kafka_settings) as producer:
        with pytest.raises(SerializationFailed, match="carries ModelCallRecorded"):
            await producer.send(topic, golden_events[REWARDS.name])


def _reward(i: int) -> RewardPublished:
    return RewardPublished(
        session_id=f"s-{i:04d}", group_id="g-1", task_id="t", reward=i / 10, outcome=Outcome.RESOLVED, resolved=True
    )


async def test_commit_after_handling_resumes_after_the_committed_message(
    kafka_settings: KafkaSettings, topic_factory: TopicFactory, consumer_group: str
) -> None:
    topic = topic_factory(REWARDS, partitions=1)
    async with Producer(kafka_settings) as producer:
        for i in range(6):
            await producer.send(topic, _reward(i))
    async with Consumer(kafka_settings, [topic], group_id=consumer_group) as consumer:
        first = await drain(consumer, 4)
        assert [m.event.session_id for m in first] == [f"s-{i:04d}" for i in range(4)]
        await consumer.commit(first[2])  # handled 0..2; 3 was fetched but not committed
    async with Consumer(kafka_settings, [topic], group_id=consumer_group) as consumer:
        rest = await drain(consumer, 3)
        assert [m.event.session_id for m in rest] == ["s-0003", "s-0004", "s-0005"]
        await consumer.commit()  # everything handed out
    async with Consumer(kafka_settings, [topic], group_id=consumer_group) as consumer:
        assert await consumer.next(timeout_s=1.5) is None


async def test_messages_fetched_by_the_poll_that_served_a_rebalance_are_not_lost(
    kafka_settings: KafkaSettings, topic_factory: TopicFactory, consumer_group: str
) -> None:
    # librdkafka runs rebalance callbacks inside poll(), and that same poll() can go on to return messages of the
    # new assignment. Here every poll serves an (empty) revocation before returning: the messages must still arrive.
    topic = topic_factory(REWARDS, partitions=1)
    async with Producer(kafka_settings) as producer:
        for i in range(3):
            await producer.send(topic, _reward(i))
    async with Consumer(kafka_settings, [topic], group_id=consumer_group) as consumer:
        fetch = consumer._fetch

        def fetch_across_a_rebalance(timeout: float) -> list[Any]:
            got = fetch(timeout)
            consumer._on_revoke(consumer._require(), [])
            return got

        consumer._fetch = fetch_across_a_rebalance  # type: ignore[method-assign]
        messages = await drain(consumer, 3, timeout_s=20.0)
    assert [m.event.session_id for m in messages] == ["s-0000", "s-0001", "s-0002"]


@pytest.mark.parametrize("sole_member", [True, False], ids=["sole-member", "asks-the-coordinator"])
async def test_a_consumer_that_lost_its_membership_rejoins_as_a_new_member(
    kafka_settings: KafkaSettings, topic_factory: TopicFactory, consumer_group: str, sole_member: bool
) -> None:
    topic = topic_factory(REWARDS, partitions=1)
    async with Producer(kafka_settings) as producer:
        await producer.send(topic, _reward(0))
        async with Consumer(
            kafka_settings, [topic], group_id=consumer_group, rejoin_after_s=3.0, sole_member=sole_member
        ) as consumer:
            first = await drain(consumer, 1)
            await consumer.commit(first[0])
            # The client leaves its group behind our back and never comes back by itself, as librdkafka once did
            # after a broker restart.
            consumer._require().unsubscribe()
            await producer.send(topic, _reward(1))
            assert await consumer.next(timeout_s=1.0) is None
            assert consumer.rejoins == 0
            rest = await drain(consumer, 1, timeout_s=30.0)
    assert rest[0].event.session_id == "s-0001"
    assert consumer.rejoins == 1


@pytest.mark.slow
async def test_a_handler_slower_than_max_poll_interval_gets_the_message_again_not_an_error(
    kafka_settings: KafkaSettings, topic_factory: TopicFactory, consumer_group: str
) -> None:
    import asyncio

    from eventbus import EventBusError

    topic = topic_factory(REWARDS, partitions=1)
    async with Producer(kafka_settings) as producer:
        await producer.send(topic, _reward(0))
    config = {"max.poll.interval.ms": 10_000}  # librdkafka's floor is session.timeout.ms (10 s)
    async with Consumer(kafka_settings, [topic], group_id=consumer_group, config=config) as consumer:
        first = await drain(consumer, 1)
        await asyncio.sleep(15)  # a slow handler: the group drops us (librdkafka checks about once a second)
        with pytest.raises(EventBusError, match="UNKNOWN_MEMBER_ID"):
            await consumer.commit(first[0])
        again = await drain(consumer, 1, timeout_s=30.0)
        await consumer.commit(again[0])
    assert again[0].event.session_id == "s-0000"


async def test_many_concurrent_sends_are_all_acked_in_key_order(
    kafka_settings: KafkaSettings, topic_factory: TopicFactory, consumer_group: str
) -> None:
    import asyncio

    topic = topic_factory(REWARDS, partitions=1)
    async with Producer(kafka_settings) as producer:
        deliveries = await asyncio.gather(*(producer.send(topic, _reward(i)) for i in range(300)))
    assert sorted(d.offset for d in deliveries) == list(range(300))
    async with Consumer(kafka_settings, [topic], group_id=consumer_group) as consumer:
        got = await drain(consumer, 300)
    assert sorted(m.event.session_id for m in got) == [f"s-{i:04d}" for i in range(300)]
