"""Read a topic's history by offset or timestamp, without a consumer group (``floe replay`` uses this).

The consumer is *assigned* partitions and never commits, so production consumer groups are untouched. The range is
half-open: from ``start`` (an offset, or the first message at/after a timestamp; default: the beginning) up to, not
including, ``end`` (an offset or timestamp; default: the end of each partition when the replay starts), so a
replay always terminates. ``read_committed``: aborted transactional messages are never replayed. A message that
does not decode is yielded with ``error`` set (and its raw bytes), never dropped silently.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import confluent_kafka
from confluent_kafka import TopicPartition

from contracts import Event, Topic, decode
from contracts.errors import ContractError
from eventbus.consumer import raw_key, raw_timestamp
from eventbus.errors import TopicMissing, map_kafka_errors
from eventbus.producer import LIBRDKAFKA_LOGGER
from eventbus.settings import KafkaSettings

__all__ = ["Position", "ReplayRecord", "parse_position", "replay"]


@dataclass(frozen=True)
class Position:
    """An offset, or a wall-clock time in epoch milliseconds (exactly one is set)."""

    offset: int | None = None
    timestamp_ms: int | None = None


def parse_position(text: str) -> Position:
    """``"1234"`` is an offset; anything else must be an ISO-8601 time (naive times are UTC)."""
    text = text.strip()
    if text.lstrip("-").isdigit():
        offset = int(text)
        if offset < 0:
            raise ValueError(f"offset must be >= 0, got {offset}")
        return Position(offset=offset)
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise ValueError(f"{text!r} is neither an offset nor an ISO-8601 time (e.g. 2026-11-30T01:00:00Z)") from exc
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return Position(timestamp_ms=int(when.timestamp() * 1000))


@dataclass(frozen=True)
class ReplayRecord:
    topic: str
    partition: int
    offset: int
    timestamp_ms: int | None
    key: str | None
    event: Event | None
    error: str | None
    value: bytes

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "topic": self.topic,
            "partition": self.partition,
            "offset": self.offset,
            "timestamp_ms": self.timestamp_ms,
            "key": self.key,
        }
        if self.event is not None:
            out["event_type"] = type(self.event).__name__
            out["event"] = self.event.model_dump(mode="json")
            inline = getattr(self.event, "arrow_ipc", None)
            if inline is not None:  # not JSON material: say how big it is (read it with contracts.read_ipc)
                out["arrow_ipc_bytes"] = len(inline)
        else:
            import base64

            out["error"] = self.error
            out["value_b64"] = base64.b64encode(self.value).decode()
        return out


def _resolve(
    consumer: confluent_kafka.Consumer,
    name: str,
    partitions: Sequence[int],
    pos: Position | None,
    default: int,
    timeout: float,
) -> dict[int, int]:
    """Partition -> concrete offset for ``pos`` (``default``: -2 beginning, -1 end; resolved via watermarks)."""
    result: dict[int, int] = {}
    marks = {p: consumer.get_watermark_offsets(TopicPartition(name, p), timeout=timeout) for p in partitions}
    if pos is not None and pos.timestamp_ms is not None:
        found = consumer.offsets_for_times(
            [TopicPartition(name, p, pos.timestamp_ms) for p in partitions], timeout=timeout
        )
        for tp in found:
            # -1: no message at or after that time: the partition's end.
            result[tp.partition] = tp.offset if tp.offset >= 0 else marks[tp.partition][1]
        return result
    for p in partitions:
        low, high = marks[p]
        if pos is not None and pos.offset is not None:
            result[p] = min(max(pos.offset, low), high)
        else:
            result[p] = low if default == -2 else high
    return result


def replay(
    settings: KafkaSettings,
    topic: Topic[Any],
    *,
    start: Position | None = None,
    end: Position | None = None,
    partitions: Sequence[int] | None = None,
    idle_timeout_s: float = 5.0,
) -> Iterator[ReplayRecord]:
    """Yield the records of ``topic`` in ``[start, end)``, partition by partition interleaved as fetched."""
    conf = {
        **settings.as_librdkafka(),
        # librdkafka needs a group id to build a consumer; assign() never joins it and we never commit.
        "group.id": f"floe-replay-{uuid.uuid4().hex}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "isolation.level": "read_committed",
        "enable.partition.eof": False,
        "max.partition.fetch.bytes": 32 * 1024 * 1024,
        "fetch.max.bytes": 64 * 1024 * 1024,
        "receive.message.max.bytes": 64 * 1024 * 1024 + 1024,
        "logger": LIBRDKAFKA_LOGGER,
    }
    timeout = settings.admin_timeout_s
    with map_kafka_errors("replay: create consumer"):
        consumer = confluent_kafka.Consumer(conf)
    try:
        with map_kafka_errors(f"replay {topic.name}: metadata"):
            meta = consumer.list_topics(topic.name, timeout=timeout).topics.get(topic.name)
        if meta is None or meta.error is not None or not meta.partitions:
            raise TopicMissing(f"topic {topic.name} does not exist")
        chosen = sorted(meta.partitions) if partitions is None else list(partitions)
        unknown = [p for p in chosen if p not in meta.partitions]
        if unknown:
            raise TopicMissing(f"topic {topic.name} has no partition {unknown} (it has {len(meta.partitions)})")
        with map_kafka_errors(f"replay {topic.name}: offsets"):
            begin = _resolve(consumer, topic.name, chosen, start, -2, timeout)
            stop = _resolve(consumer, topic.name, chosen, end, -1, timeout)
        live = {p for p in chosen if begin[p] < stop[p]}
        if not live:
            return
        with map_kafka_errors(f"replay {topic.name}: assign"):
            consumer.assign([TopicPartition(topic.name, p, begin[p]) for p in sorted(live)])
        last_progress = time.monotonic()
        while live:
            with map_kafka_errors(f"replay {topic.name}: poll"):
                msg = consumer.poll(0.2)
            if msg is None:
                # Transaction markers and aborted records occupy offsets we never receive: the position tells.
                with map_kafka_errors(f"replay {topic.name}: position"):
                    for tp in consumer.position([TopicPartition(topic.name, p) for p in list(live)]):
                        if tp.offset >= stop[tp.partition]:
                            live.discard(tp.partition)
                if time.monotonic() - last_progress > idle_timeout_s:
                    return
                continue
            err = msg.error()
            if err is not None:
                from eventbus.errors import from_kafka_error

                mapped = from_kafka_error(err, f"replay {topic.name}")
                if mapped.retriable:
                    continue
                raise mapped
            last_progress = time.monotonic()
            p, offset = msg.partition() or 0, msg.offset() or 0
            if p not in live:
                continue
            if offset >= stop[p]:
                live.discard(p)
                continue
            value = msg.value() or b""
            event: Event | None = None
            error: str | None = None
            try:
                event = decode(topic.model, value)
            except ContractError as exc:
                error = f"{type(exc).__name__}: {exc}"
            yield ReplayRecord(topic.name, p, offset, raw_timestamp(msg), raw_key(msg), event, error, bytes(value))
            if offset + 1 >= stop[p]:
                live.discard(p)
    finally:
        consumer.close()
