"""Read topics' history by offset or timestamp, without a consumer group: the one "read to the end" of floe.

``replay`` (sync) and ``replay_async`` (the same records, for event-loop code) serve ``floe replay``, ``floe audit``,
the scorer's dedupe memory and the rollout's state rebuild. The consumer is *assigned* partitions and never commits,
so production consumer groups are untouched. The range is half-open: from ``start`` (an offset, or the first message
at/after a timestamp; default: the beginning) up to, not including, ``end`` (an offset or timestamp; default: the
end of each partition when the replay starts), so a replay always terminates. Several topics are read by one
consumer, their records interleaved as fetched (in order within a partition). ``read_committed``: aborted
transactional messages are never replayed, and a partition whose last offsets are transaction markers ends as soon
as the consumer's position passes them (no idle wait). ``idle_timeout_s`` bounds a stall: with no message and no
progress that long (a broker that does not answer, an open transaction of another producer holding the stable
offset back), the replay ends early, quietly. A message that does not decode is yielded with ``error`` set (and
its raw bytes), never dropped silently; the caller decides whether to skip it.
"""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from collections.abc import AsyncGenerator, Generator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import confluent_kafka
from confluent_kafka import TopicPartition

from contracts import Event, Topic, decode
from contracts.errors import ContractError
from eventbus.admin import _watermarks
from eventbus.consumer import is_seal, raw_key, raw_timestamp
from eventbus.errors import OperationTimeout, TopicMissing, from_kafka_error, map_kafka_errors
from eventbus.producer import LIBRDKAFKA_LOGGER
from eventbus.settings import KafkaSettings

__all__ = ["Position", "ReplayRecord", "parse_position", "replay", "replay_async"]

MiB = 1024 * 1024


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
    marks = {p: _watermarks(consumer, TopicPartition(name, p), timeout) for p in partitions}
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


def reader_conf(settings: KafkaSettings, prefix: str) -> dict[str, Any]:
    """librdkafka settings of a consumer that reads assigned partitions (read_committed) and never commits."""
    return {
        **settings.as_librdkafka(),
        # librdkafka needs a group id to build a consumer; assign() never joins it and we never commit.
        "group.id": f"{prefix}-{uuid.uuid4().hex}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "isolation.level": "read_committed",
        "enable.partition.eof": False,
        "max.partition.fetch.bytes": 32 * MiB,
        "fetch.max.bytes": 64 * MiB,
        "receive.message.max.bytes": 64 * MiB + 1024,
        "logger": LIBRDKAFKA_LOGGER,
    }


def to_record(msg: confluent_kafka.Message, model: type[Event]) -> ReplayRecord:
    """One fetched message as a record: decoded, or with ``error`` set when it does not decode."""
    value = msg.value() or b""
    event: Event | None = None
    error: str | None = None
    try:
        event = decode(model, value)
    except ContractError as exc:
        error = f"{type(exc).__name__}: {exc}"
    return ReplayRecord(
        msg.topic() or "", msg.partition() or 0, msg.offset() or 0, raw_timestamp(msg), raw_key(msg), event, error,
        bytes(value),
    )  # fmt: skip


def replay(
    settings: KafkaSettings,
    topics: Topic[Any] | Sequence[Topic[Any]],
    *,
    start: Position | None = None,
    end: Position | None = None,
    partitions: Sequence[int] | None = None,
    idle_timeout_s: float = 5.0,
    require_end: bool = False,
) -> Generator[ReplayRecord, None, None]:
    """Yield the records of ``topics`` (one topic or several) in ``[start, end)``, interleaved as fetched.

    ``start``, ``end`` and ``partitions`` apply to every topic; a topic (or a chosen partition) that does not exist
    raises ``TopicMissing`` before anything is yielded.

    The default ``end`` is where a read_committed reader stops today: the stable end, before the first open
    transaction. A producer that died mid-transaction keeps it there until the transaction times out, so records
    committed after that transaction are not read; a reader that also consumes the topic live gets them from there.
    With ``require_end`` the default end is the log's end instead, and a read held back short of it for
    ``idle_timeout_s`` raises ``OperationTimeout`` (retriable): for a caller that must have seen every committed
    record (state nothing else will bring it), an early end is a wrong answer.
    """
    chosen_topics = [topics] if isinstance(topics, Topic) else list(topics)
    models = {t.name: t.model for t in chosen_topics}
    conf = reader_conf(settings, "floe-replay")
    timeout = settings.admin_timeout_s
    with map_kafka_errors("replay: create consumer"):
        consumer = confluent_kafka.Consumer(conf)
        # Offsets come from a read_committed consumer as the stable end; the log's end needs a read_uncommitted one.
        ends = confluent_kafka.Consumer({**conf, "isolation.level": "read_uncommitted"}) if require_end else consumer
    try:
        begin: dict[tuple[str, int], int] = {}
        stop: dict[tuple[str, int], int] = {}
        for name in models:
            with map_kafka_errors(f"replay {name}: metadata"):
                meta = consumer.list_topics(name, timeout=timeout).topics.get(name)
            if meta is None or meta.error is not None or not meta.partitions:
                raise TopicMissing(f"topic {name} does not exist")
            chosen = sorted(meta.partitions) if partitions is None else list(partitions)
            unknown = [p for p in chosen if p not in meta.partitions]
            if unknown:
                raise TopicMissing(f"topic {name} has no partition {unknown} (it has {len(meta.partitions)})")
            with map_kafka_errors(f"replay {name}: offsets"):
                first = _resolve(consumer, name, chosen, start, -2, timeout)
                last = _resolve(ends, name, chosen, end, -1, timeout)
            begin.update({(name, p): first[p] for p in chosen})
            stop.update({(name, p): last[p] for p in chosen})
        live = {tp for tp in begin if begin[tp] < stop[tp]}
        if not live:
            return
        label = ", ".join(models)
        with map_kafka_errors(f"replay {label}: assign"):
            consumer.assign([TopicPartition(n, p, begin[(n, p)]) for n, p in sorted(live)])
        last_progress = time.monotonic()
        while live:
            with map_kafka_errors(f"replay {label}: poll"):
                msg = consumer.poll(0.2)
            if msg is None:
                # Transaction markers and aborted records occupy offsets we never receive: the position tells.
                with map_kafka_errors(f"replay {label}: position"):
                    for tp in consumer.position([TopicPartition(n, p) for n, p in list(live)]):
                        if tp.offset >= stop[(tp.topic, tp.partition)]:
                            live.discard((tp.topic, tp.partition))
                            last_progress = time.monotonic()
                if live and time.monotonic() - last_progress > idle_timeout_s:
                    if require_end:
                        where = ", ".join(f"{n}[{p}] < {stop[(n, p)]}" for n, p in sorted(live))
                        raise OperationTimeout(
                            f"replay {label}: no progress for {idle_timeout_s:g}s short of the end ({where}); an open "
                            "transaction holds the stable offset back"
                        )
                    return
                continue
            err = msg.error()
            if err is not None:
                mapped = from_kafka_error(err, f"replay {label}")
                if mapped.retriable:
                    continue
                raise mapped
            last_progress = time.monotonic()
            key = (msg.topic() or "", msg.partition() or 0)
            offset = msg.offset() or 0
            if key not in live:
                continue
            if offset >= stop[key]:
                live.discard(key)
                continue
            if not is_seal(msg.headers()):
                yield to_record(msg, models[key[0]])
            if offset + 1 >= stop[key]:
                live.discard(key)
    finally:
        consumer.close()
        if ends is not consumer:
            ends.close()


async def replay_async(
    settings: KafkaSettings,
    topics: Topic[Any] | Sequence[Topic[Any]],
    *,
    start: Position | None = None,
    end: Position | None = None,
    partitions: Sequence[int] | None = None,
    idle_timeout_s: float = 5.0,
    require_end: bool = False,
    chunk_bytes: int = 16 * MiB,
) -> AsyncGenerator[ReplayRecord, None]:
    """``replay`` for event-loop code: the same records, while the loop keeps serving (e.g. ``/health``).

    The sync replay runs on one dedicated worker thread (librdkafka's consumer never changes threads) and hands
    records over in chunks of up to ``chunk_bytes`` of message values (at least one record), so a topic of large
    batches is never held in memory whole. Leaving the loop early closes the consumer on that thread.
    """
    records = replay(
        settings,
        topics,
        start=start,
        end=end,
        partitions=partitions,
        idle_timeout_s=idle_timeout_s,
        require_end=require_end,
    )
    loop = asyncio.get_running_loop()
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="floe-replay")
    try:
        while chunk := await loop.run_in_executor(executor, _take, records, chunk_bytes):
            for record in chunk:
                yield record
    finally:
        # Queued behind a chunk still being read (after a cancellation), so the generator never runs on two threads.
        executor.submit(records.close)
        executor.shutdown(wait=False)


def _take(records: Iterator[ReplayRecord], max_bytes: int) -> list[ReplayRecord]:
    out: list[ReplayRecord] = []
    size = 0
    for record in records:
        out.append(record)
        size += len(record.value)
        if size >= max_bytes or len(out) >= 1024:
            break
    return out
