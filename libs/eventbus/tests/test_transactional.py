"""TransactionalProcessor in-process: abort rewinds, outputs of aborted transactions stay invisible, poison input
is dead-lettered inside the transaction (exactly once, even across an abort), misuse is a clear error."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import confluent_kafka
import pytest

from contracts import (
    DEAD_LETTER,
    REWARDS,
    SESSIONS_FINISHED,
    Outcome,
    RewardPublished,
    SessionFinished,
    SessionState,
    Topic,
)
from eventbus import ClientStateError, Consumer, KafkaSettings, Producer, TransactionalProcessor
from eventbus.metrics import new_registry

pytestmark = pytest.mark.integration


def finished(i: int) -> SessionFinished:
    return SessionFinished(
        session_id=f"s-{i:03d}", group_id="g", task_id="t", harness="pi", node_id="n", status=SessionState.DONE
    )


def reward_for(ev: SessionFinished) -> RewardPublished:
    return RewardPublished(
        session_id=ev.session_id,
        group_id=ev.group_id,
        task_id=ev.task_id,
        reward=0.0,
        outcome=Outcome.UNRESOLVED,
        resolved=False,
    )


async def test_abort_rewinds_and_hides_outputs_then_commit_publishes_once(
    kafka_settings: KafkaSettings, topic_factory: Callable[..., Topic[Any]], consumer_group: str
) -> None:
    inp = topic_factory(SESSIONS_FINISHED, partitions=1)
    out, dlq = topic_factory(REWARDS, partitions=1), topic_factory(DEAD_LETTER)
    # Poison first: it is then in the first chunk of every attempt, aborted or committed.
    raw = confluent_kafka.Producer(kafka_settings.as_librdkafka())
    raw.produce(inp.name, b"\x00 poison", b"s-bad")
    assert raw.flush(30) == 0
    del raw
    async with Producer(kafka_settings) as producer:
        for i in range(5):
            await producer.send(inp, finished(i))

    attempts: list[list[str]] = []
    committed: list[str] = []
    async with TransactionalProcessor(
        kafka_settings, [inp], consumer_group, f"txn-{uuid.uuid4().hex[:8]}", dead_letter=dlq, max_batch=10
    ) as tp:
        async for batch in tp.batches(timeout_s=30):
            attempts.append([m.event.session_id for m in batch])
            for m in batch:
                tp.produce(out, reward_for(m.event))
            if len(attempts) == 1:
                await tp.abort()  # the first attempt is aborted: its input must come again
                continue
            assert await tp.commit(batch)
            committed += attempts[-1]
            if len(committed) == 5:
                break
        with pytest.raises(ClientStateError):
            tp.produce(out, reward_for(finished(1)))  # outside a batch

    assert attempts[0] == [f"s-{i:03d}" for i in range(len(attempts[0]))]
    assert committed == [f"s-{i:03d}" for i in range(5)], attempts
    async with Consumer(kafka_settings, [out], group_id=consumer_group + "-out") as reader:
        got = [m.event.session_id for m in await _all(reader)]
    assert got == committed, "aborted outputs leaked or committed outputs are missing"
    async with Consumer(kafka_settings, [dlq], group_id=consumer_group + "-dlq") as reader:
        letters = await _all(reader)
    assert [(m.event.offset, m.event.key) for m in letters] == [(0, "s-bad")], "poison must be dead-lettered once"


async def _all(consumer: Consumer[Any], quiet_s: float = 2.0) -> list[Any]:
    got = []
    while (msg := await consumer.next(timeout_s=quiet_s)) is not None:
        got.append(msg)
    return got


async def test_a_processor_dropped_from_its_group_rejoins_and_a_listed_standby_does_not(
    kafka_settings: KafkaSettings, topic_factory: Callable[..., Topic[Any]], consumer_group: str
) -> None:
    """librdkafka can drop a member after a broker restart and never join again (``eventbus.membership``): the
    processor notices that the group has settled without it and comes back as a new member. A standby that owns
    nothing by design is listed, and stays as it is."""
    inp = topic_factory(SESSIONS_FINISHED, partitions=1)
    got: list[str] = []
    first = asyncio.Event()

    async def work(active: TransactionalProcessor[SessionFinished]) -> None:
        async for batch in active.batches(timeout_s=60):
            got.extend(m.event.session_id for m in batch)
            assert await active.commit(batch)
            first.set()
            if len(got) == 2:
                return

    async with Producer(kafka_settings) as producer:
        await producer.send(inp, finished(0))
        registry = new_registry()
        async with TransactionalProcessor(
            kafka_settings, [inp], consumer_group, f"txn-{uuid.uuid4().hex[:8]}", rejoin_after_s=2.0, registry=registry
        ) as active:
            worker = asyncio.create_task(work(active))
            await asyncio.wait_for(first.wait(), 30)
            # A second member owns nothing for several watchdog periods while the first keeps working.
            async with TransactionalProcessor(
                kafka_settings, [inp], consumer_group, f"txn-{uuid.uuid4().hex[:8]}", rejoin_after_s=2.0
            ) as standby:
                async for _ in standby.batches(timeout_s=9.0):
                    raise AssertionError("the standby got input the active member owns")
            assert standby.rejoins == 0, "a standby the coordinator lists must not rejoin"
            # The active member leaves its group behind its own back, as librdkafka did, and input arrives.
            await active._call(active._require_consumer().unsubscribe)
            await producer.send(inp, finished(1))
            await asyncio.wait_for(worker, 60)
    assert got == ["s-000", "s-001"]
    assert active.rejoins == 1
    assert registry.get_sample_value("floe_eventbus_group_rejoins_total", {"group": consumer_group}) == 1
