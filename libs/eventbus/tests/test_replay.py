"""``eventbus.replay`` on the real broker: the one "read topics to their end" (floe replay, audit, rollout rebuild).

Several topics in one read; committed transactions only; a partition ending in a transaction marker ends at once
(no idle wait); an undecodable message is yielded with its error; ``replay_async`` keeps the event loop free and
closes its consumer when the caller stops early.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import confluent_kafka
import pytest

from contracts import REWARDS, SESSIONS_FINISHED, Outcome, RewardPublished, SessionFinished, SessionState, Topic, encode
from eventbus import KafkaSettings, OperationTimeout
from eventbus.replay import replay, replay_async

pytestmark = pytest.mark.integration

# Far above what any read below takes: a replay that waited for it would fail the time checks.
IDLE_S = 30.0


def finished(name: str) -> SessionFinished:
    return SessionFinished(
        session_id=name, group_id="g", task_id="t", harness="pi", node_id="n", status=SessionState.DONE
    )


def reward(i: int) -> RewardPublished:
    return RewardPublished(
        session_id=f"r-{i}", group_id="g", task_id="t", reward=1.0, outcome=Outcome.RESOLVED, resolved=True
    )


def write_transactions(settings: KafkaSettings, topic: Topic[Any]) -> None:
    """committed a0 a1 | aborted b0 b1 | committed c0: the partition ends in a commit marker."""
    p = confluent_kafka.Producer({**settings.as_librdkafka(), "transactional.id": f"replay-{uuid.uuid4().hex[:8]}"})
    p.init_transactions(30)
    for names, commit in ((["a0", "a1"], True), (["b0", "b1"], False), (["c0"], True)):
        p.begin_transaction()
        for name in names:
            p.produce(topic.name, encode(finished(name)), name.encode())
        p.flush(30)
        if commit:
            p.commit_transaction(30)
        else:
            p.abort_transaction(30)


@pytest.fixture
def two_topics(kafka_settings: KafkaSettings, topic_factory: Callable[..., Topic[Any]]) -> tuple[Topic[Any], ...]:
    txn_topic = topic_factory(SESSIONS_FINISHED, partitions=1)
    plain = topic_factory(REWARDS, partitions=2)
    write_transactions(kafka_settings, txn_topic)
    raw = confluent_kafka.Producer(kafka_settings.as_librdkafka())
    for i in range(6):
        raw.produce(plain.name, encode(reward(i)), f"r-{i}".encode(), partition=i % 2)
    raw.produce(plain.name, b"not an event", b"r-junk", partition=1)  # our Producer would refuse to write it
    assert raw.flush(30) == 0
    return txn_topic, plain


def test_sync_replay_reads_committed_records_of_several_topics_to_their_end(
    kafka_settings: KafkaSettings, two_topics: tuple[Topic[Any], ...]
) -> None:
    txn_topic, plain = two_topics
    t0 = time.monotonic()
    records = list(replay(kafka_settings, [txn_topic, plain], idle_timeout_s=IDLE_S))
    assert time.monotonic() - t0 < IDLE_S / 3  # ended by positions, not by the idle timeout
    by_topic: dict[str, list[Any]] = {txn_topic.name: [], plain.name: []}
    for r in records:
        by_topic[r.topic].append(r)
    # Aborted b0, b1 never appear; the offsets of the markers are skipped.
    assert [r.event.session_id for r in by_topic[txn_topic.name]] == ["a0", "a1", "c0"]
    assert [r.offset for r in by_topic[txn_topic.name]] == [0, 1, 6]  # 2, 5, 7: markers
    good = [r for r in by_topic[plain.name] if r.event is not None]
    bad = [r for r in by_topic[plain.name] if r.event is None]
    assert sorted(r.event.session_id for r in good) == [f"r-{i}" for i in range(6)]
    assert len(bad) == 1 and bad[0].value == b"not an event" and bad[0].error and "DecodeError" in bad[0].error
    # One topic and a partition subset still work as before.
    only_p1 = list(replay(kafka_settings, plain, partitions=[1], idle_timeout_s=IDLE_S))
    assert {r.partition for r in only_p1} == {1} and len(only_p1) == len(
        [r for r in by_topic[plain.name] if r.partition == 1]
    )


async def test_replay_async_yields_the_same_records_without_blocking_the_loop(
    kafka_settings: KafkaSettings, two_topics: tuple[Topic[Any], ...]
) -> None:
    txn_topic, plain = two_topics
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.create_task(ticker())
    try:
        t0 = time.monotonic()
        # A tiny chunk size: every record is its own hand-over from the worker thread.
        got = [r async for r in replay_async(kafka_settings, [txn_topic, plain], idle_timeout_s=IDLE_S, chunk_bytes=1)]
        elapsed = time.monotonic() - t0
    finally:
        task.cancel()
    assert elapsed < IDLE_S / 3
    assert ticks > 0  # the loop ran while the replay read
    want = await asyncio.to_thread(lambda: list(replay(kafka_settings, [txn_topic, plain], idle_timeout_s=IDLE_S)))
    key = lambda r: (r.topic, r.partition, r.offset)  # noqa: E731
    assert sorted(map(key, got)) == sorted(map(key, want))
    assert len(got) == 3 + 7


async def test_leaving_replay_async_early_closes_its_consumer(
    kafka_settings: KafkaSettings, two_topics: tuple[Topic[Any], ...]
) -> None:
    def replay_threads() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name.startswith("floe-replay")]

    before = set(replay_threads())
    async with contextlib.aclosing(replay_async(kafka_settings, list(two_topics), chunk_bytes=1)) as records:
        async for _ in records:
            break
    deadline = time.monotonic() + 10
    while set(replay_threads()) - before and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not set(replay_threads()) - before, "the replay's worker thread (and its consumer) outlived the loop"


def test_an_open_transaction_ends_a_read_early_unless_the_end_is_required(
    kafka_settings: KafkaSettings, topic_factory: Callable[..., Topic[Any]]
) -> None:
    """The rollout leader's rebuild: a dead producer's open transaction holds the stable end back, and a batch
    committed after it is unseen. A plain read stops there without a word; ``require_end`` says so (retriable), and
    once the transaction ends the read gets everything."""
    topic = topic_factory(SESSIONS_FINISHED, partitions=1)
    dead = confluent_kafka.Producer({**kafka_settings.as_librdkafka(), "transactional.id": f"dead-{uuid.uuid4().hex}"})
    dead.init_transactions(30)
    dead.begin_transaction()
    dead.produce(topic.name, encode(finished("open-0")), b"open-0")
    assert dead.flush(30) == 0  # written, never committed: the producer is "killed" here
    write_transactions(kafka_settings, topic)  # committed a0 a1 c0 behind it

    assert list(replay(kafka_settings, topic, idle_timeout_s=1.0)) == []  # ends at the stable end, silently
    with pytest.raises(OperationTimeout, match="short of the end") as exc:
        list(replay(kafka_settings, topic, idle_timeout_s=1.0, require_end=True))
    assert exc.value.retriable

    dead.abort_transaction(30)  # what the coordinator does at transaction.timeout.ms
    names = [r.event.session_id for r in replay(kafka_settings, topic, idle_timeout_s=IDLE_S, require_end=True)]
    assert names == ["a0", "a1", "c0"]
