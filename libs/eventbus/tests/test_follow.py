"""``eventbus.Follower`` on the real broker: every partition from the beginning, committed records only, ``caught_up``
once the start's end offsets are reached (by positions, not by waiting), records written later keep coming, no
consumer group is joined or committed, and a missing topic is a clear ``TopicMissing``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

import confluent_kafka
import pytest

from contracts import SESSIONS_FINISHED, SessionFinished, SessionState, Topic, encode
from eventbus import Follower, KafkaSettings, TopicMissing
from eventbus.replay import ReplayRecord

pytestmark = pytest.mark.integration

# Far above what catching up takes: a follower that waited for it would fail the time check.
IDLE_S = 30.0


def finished(name: str) -> SessionFinished:
    return SessionFinished(
        session_id=name, group_id=name, task_id="t", harness="pi", node_id="n", status=SessionState.DONE
    )


def write(settings: KafkaSettings, topic: Topic[Any], batches: list[tuple[list[str], bool]]) -> None:
    """Each batch is one transaction, committed or aborted; name i goes to partition i % 2."""
    p = confluent_kafka.Producer({**settings.as_librdkafka(), "transactional.id": f"follow-{uuid.uuid4().hex[:8]}"})
    p.init_transactions(30)
    for names, commit in batches:
        p.begin_transaction()
        for name in names:
            p.produce(topic.name, encode(finished(name)), name.encode(), partition=int(name.split("-")[1]) % 2)
        p.flush(30)
        if commit:
            p.commit_transaction(30)
        else:
            p.abort_transaction(30)


async def read_until(follower: Follower, want: int, timeout_s: float = 30.0) -> list[ReplayRecord]:
    got: list[ReplayRecord] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        got += await follower.poll(100, 0.2)
    return got


async def test_follows_every_partition_from_the_beginning_and_on(
    kafka_settings: KafkaSettings, topic_factory: Callable[..., Topic[Any]]
) -> None:
    topic = topic_factory(SESSIONS_FINISHED, partitions=2)
    write(kafka_settings, topic, [([f"a-{i}" for i in range(4)], True), (["b-0", "b-1"], False), (["c-5"], True)])
    t0 = time.monotonic()
    async with Follower(kafka_settings, [topic], idle_timeout_s=IDLE_S) as follower:
        assert not follower.caught_up
        got = await read_until(follower, 5)
        while not follower.caught_up and time.monotonic() - t0 < IDLE_S / 3:
            got += await follower.poll(100, 0.2)
        assert follower.caught_up, "caught up by positions (past the commit markers), not by the idle timeout"
        names = [r.event.session_id for r in got if r.event is not None]
        assert sorted(names) == ["a-0", "a-1", "a-2", "a-3", "c-5"]  # the aborted b-* never appear
        assert {r.partition for r in got} == {0, 1}
        for p in (0, 1):  # in order within a partition
            offsets = [r.offset for r in got if r.partition == p]
            assert offsets == sorted(offsets)

        # Written after the start: still delivered, once.
        write(kafka_settings, topic, [(["d-6", "d-7"], True)])
        later = await read_until(follower, 2)
        assert sorted(r.event.session_id for r in later if r.event is not None) == ["d-6", "d-7"]
        assert await follower.poll(100, 0.5) == []


async def test_an_empty_topic_is_caught_up_at_once_and_no_group_is_left(
    kafka_settings: KafkaSettings, topic_factory: Callable[..., Topic[Any]]
) -> None:
    topic = topic_factory(SESSIONS_FINISHED, partitions=2)
    async with Follower(kafka_settings, [topic], idle_timeout_s=IDLE_S) as follower:
        assert follower.caught_up
        assert await follower.poll(10, 0.2) == []
    admin = confluent_kafka.admin.AdminClient(kafka_settings.as_librdkafka())
    groups = await asyncio.to_thread(lambda: admin.list_consumer_groups(request_timeout=30).result())
    assert not [g for g in groups.valid if g.group_id.startswith("floe-follow-")], "a follower never joins a group"


async def test_a_missing_topic_is_topic_missing(kafka_settings: KafkaSettings) -> None:
    missing = SESSIONS_FINISHED.with_name(f"floe.missing.{uuid.uuid4().hex[:8]}")
    with pytest.raises(TopicMissing, match="does not exist"):
        async with Follower(kafka_settings, [missing]):
            pass
