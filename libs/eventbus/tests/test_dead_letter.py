"""Poison messages go to the dead-letter topic with the reason; the consumer carries on and never re-dead-letters."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import confluent_kafka
import pytest

from contracts import DEAD_LETTER, MODEL_CALLS, DeadLetter, Event, Topic, encode
from eventbus import Consumer, KafkaSettings

pytestmark = pytest.mark.integration


def produce_raw(settings: KafkaSettings, topic: str, values: list[bytes]) -> None:
    """Write bytes that our Producer would refuse to write (that is the point of a poison message)."""
    p = confluent_kafka.Producer(settings.as_librdkafka())
    for v in values:
        p.produce(topic, v, b"s-poison")
    assert p.flush(30) == 0


async def test_poison_messages_are_dead_lettered_and_skipped(
    kafka_settings: KafkaSettings,
    topic_factory: Callable[..., Topic[Any]],
    consumer_group: str,
    golden_events: dict[str, Event],
) -> None:
    topic = topic_factory(MODEL_CALLS, partitions=1)
    dlq = topic_factory(DEAD_LETTER)
    good = encode(golden_events[MODEL_CALLS.name])
    newer = json.loads(good)
    newer["schema_version"] = 99
    values = [b"not json at all", good, json.dumps(newer).encode(), good, b'{"schema_version": 1}']
    produce_raw(kafka_settings, topic.name, values)

    async with Consumer(kafka_settings, [topic], group_id=consumer_group, dead_letter=dlq) as consumer:
        first = await consumer.next(timeout_s=30)
        second = await consumer.next(timeout_s=30)
        assert first is not None and second is not None
        assert (first.offset, second.offset) == (1, 3)
        assert first.event == golden_events[MODEL_CALLS.name]
        # offset 2 was dead-lettered while 1 was not yet committed: committing 1 must also move past 2.
        await consumer.commit(first)
        await consumer.commit(second)
        assert await consumer.next(timeout_s=1.0) is None  # handles the trailing poison at offset 4

    async with Consumer(kafka_settings, [dlq], group_id=consumer_group + "-dlq") as reader:
        letters = [m.event for m in [await reader.next(timeout_s=30) for _ in range(3)] if m is not None]
        await reader.commit()
    assert [(d.offset, d.error_type) for d in letters] == [
        (0, "DecodeError"),
        (2, "SchemaVersionError"),
        (4, "DecodeError"),
    ]
    for letter in letters:
        assert isinstance(letter, DeadLetter)
        assert letter.source_topic == topic.name and letter.partition == 0 and letter.consumer_group == consumer_group
        assert base64.b64decode(letter.value_b64) == values[letter.offset]
        assert letter.key == "s-poison" and letter.reason
    assert "schema_version 99" in letters[1].reason

    # Restart: everything (including the poison) was committed, so nothing comes back and nothing is re-dead-lettered.
    async with Consumer(kafka_settings, [topic], group_id=consumer_group, dead_letter=dlq) as consumer:
        assert await consumer.next(timeout_s=2.0) is None
    async with Consumer(kafka_settings, [dlq], group_id=consumer_group + "-dlq") as reader:
        assert await reader.next(timeout_s=1.5) is None


async def test_a_broken_message_on_the_dead_letter_topic_is_skipped_not_looped(
    kafka_settings: KafkaSettings, topic_factory: Callable[..., Topic[Any]], consumer_group: str
) -> None:
    dlq = topic_factory(DEAD_LETTER)
    good = DeadLetter(source_topic="t", partition=0, offset=1, value_b64="", error_type="DecodeError", reason="r")
    produce_raw(kafka_settings, dlq.name, [b"garbage", encode(good)])
    async with Consumer(kafka_settings, [dlq], group_id=consumer_group, dead_letter=dlq) as reader:
        first = await reader.next(timeout_s=30)
        assert first is not None and first.offset == 1 and first.event == good
        await reader.commit(first)
        assert await reader.next(timeout_s=1.5) is None  # the garbage was not re-published into the topic
