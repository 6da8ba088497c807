"""The aiokafka consumer reads what the confluent-kafka (librdkafka) producers write: same contracts, same rules.

Written with our ``Producer`` (idempotent, lz4, floe headers) and a raw librdkafka transactional producer (one
aborted and one committed transaction), read with ``AioConsumer``: only committed events, decoded with their
contract, with key and headers; a poison message goes to the dead-letter topic once, as ``Consumer`` would write
it; commits let a new member of the group resume after them.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import confluent_kafka
import pytest

from contracts import DEAD_LETTER, MODEL_CALLS, DeadLetter, Event, ModelCallRecorded, Topic, encode
from eventbus import Consumer, KafkaSettings, Producer
from eventbus.aio_consumer import AioConsumer
from eventbus.errors import BrokerUnavailable

pytestmark = pytest.mark.integration


def _call(golden: ModelCallRecorded, index: int) -> ModelCallRecorded:
    # Later calls of the same session stay valid (a prefix names an earlier call).
    return golden.model_copy(update={"call_index": golden.call_index + index, "call_id": f"c-{index}"})


def _transactions(settings: KafkaSettings, topic: str, aborted: bytes, committed: bytes, txn_id: str) -> None:
    p = confluent_kafka.Producer({**settings.as_librdkafka(), "transactional.id": txn_id, "compression.type": "lz4"})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(topic, aborted, b"s-1")
    p.flush(30)
    p.abort_transaction(30)
    p.begin_transaction()
    p.produce(topic, committed, b"s-1")
    p.commit_transaction(30)


async def test_aiokafka_reads_committed_events_of_the_librdkafka_producers(
    kafka_settings: KafkaSettings,
    topic_factory: Callable[..., Topic[Any]],
    consumer_group: str,
    golden_events: dict[str, Event],
) -> None:
    golden = golden_events[MODEL_CALLS.name]
    assert isinstance(golden, ModelCallRecorded)
    topic = topic_factory(MODEL_CALLS, partitions=1)
    dlq = topic_factory(DEAD_LETTER)
    async with Producer(kafka_settings) as producer:
        await producer.send(topic, _call(golden, 0))
    raw = confluent_kafka.Producer(kafka_settings.as_librdkafka())
    raw.produce(topic.name, b"not json at all", b"s-poison")
    assert raw.flush(30) == 0
    _transactions(kafka_settings, topic.name, encode(_call(golden, 1)), encode(_call(golden, 2)), consumer_group)

    async with AioConsumer(kafka_settings, [topic], group_id=consumer_group, dead_letter=dlq) as consumer:
        first = await consumer.next(timeout_s=30)
        second = await consumer.next(timeout_s=30)
        assert first is not None and second is not None
        assert first.event == _call(golden, 0) and second.event == _call(golden, 2)  # the aborted call 1 is unseen
        assert first.key == golden.group_id and first.headers["floe-event"] == b"ModelCallRecorded"
        # 1: the poison; 2: the aborted write, 3: its abort marker; 4: the committed one
        assert (first.offset, second.offset) == (0, 4)
        await consumer.commit(first)
        assert await consumer.next(timeout_s=1.0) is None

    # The dead letter, read back with the librdkafka consumer: the same DeadLetter contract either client writes.
    async with Consumer(kafka_settings, [dlq], group_id=consumer_group + "-dlq") as reader:
        letter = await reader.next(timeout_s=30)
        assert letter is not None and await reader.next(timeout_s=1.0) is None
    assert isinstance(letter.event, DeadLetter)
    assert (letter.event.source_topic, letter.event.offset, letter.event.error_type) == (topic.name, 1, "DecodeError")
    assert base64.b64decode(letter.event.value_b64) == b"not json at all" and letter.key == topic.name

    # A new member resumes after the commit (call 0) and past the poison: call 2 again, nothing dead-lettered twice.
    async with AioConsumer(kafka_settings, [topic], group_id=consumer_group, dead_letter=dlq) as again:
        msg = await again.next(timeout_s=30)
        assert msg is not None and msg.event == _call(golden, 2)
        await again.commit()
    async with Consumer(kafka_settings, [dlq], group_id=consumer_group + "-dlq2") as reader:
        assert await reader.next(timeout_s=10) is not None
        assert await reader.next(timeout_s=1.5) is None


async def test_an_unreachable_broker_is_broker_unavailable() -> None:
    settings = KafkaSettings(bootstrap_servers="127.0.0.1:1")
    with pytest.raises(BrokerUnavailable, match=r"127\.0\.0\.1:1"):
        async with AioConsumer(settings, [MODEL_CALLS], group_id="g-unreachable"):
            pass
