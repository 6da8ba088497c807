"""Async consumer with manual commits and a dead-letter path for poison messages.

``async with Consumer(settings, [topic], group_id="rollout") as c: async for msg in c: ...; await c.commit(msg)``

- ``read_committed`` (never sees aborted or open transactions), ``enable.auto.commit=false``: offsets move only
  when the application commits, *after* its handler succeeded: at-least-once. ``commit(msg)`` commits
  ``msg.offset + 1`` of that partition; ``commit()`` commits everything handed out so far.
- A message that does not decode with its topic's contract (``contracts.decode``) is published to the dead-letter
  topic (``DeadLetter`` with the reason and the raw bytes) and skipped. Its offset is committed as soon as every
  earlier message of its partition is, so a poison message is dead-lettered once, not on every restart.
- librdkafka's sync ``Consumer`` runs on ONE dedicated worker thread (every call: poll, commit, close), so the event
  loop never blocks and the client is never used from two threads at once.

- ``rejoin_after_s`` (30 s; None: off): librdkafka can drop a member from its group and never join again
  (``eventbus.membership`` says how); the service then gets no more input and nothing raises. A member that has
  owned no partition that long asks the group's coordinator, and if the group has settled without it, closes its
  librdkafka client and joins again with a new one. ``sole_member=True`` (the learner, a reloader: the only member
  of their group, so they should always own partitions) skips the question and rejoins at once.

Limits: messages of one partition are handed out in order; the caller decides concurrency. With a consumer group,
a rebalance may redeliver messages handled but not yet committed (at-least-once). Static membership
(``group_instance_id``) lets a restarted instance take its partitions back without waiting for a session timeout.
"""

from __future__ import annotations

import asyncio
import base64
import threading
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from types import TracebackType
from typing import Any, Generic, Literal, TypeVar

import confluent_kafka
import structlog
from confluent_kafka import KafkaError, TopicPartition
from prometheus_client import CollectorRegistry

from contracts import DEAD_LETTER, DeadLetter, Event, Topic, decode
from contracts.errors import ContractError
from eventbus.errors import (
    ClientStateError,
    SerializationFailed,
    from_kafka_error,
    map_kafka_errors,
)
from eventbus.membership import Membership, close_within
from eventbus.metrics import bus_metrics
from eventbus.producer import KAFKA_LINES, LIBRDKAFKA_LOGGER, Producer
from eventbus.settings import KafkaSettings

__all__ = ["Consumer", "Message", "consumer_config", "dead_letter_for", "raw_headers", "raw_key", "raw_timestamp"]

log = structlog.get_logger()

E = TypeVar("E", bound=Event)
MiB = 1024 * 1024


def consumer_config(settings: KafkaSettings, group_id: str, **overrides: Any) -> dict[str, Any]:
    """librdkafka consumer config: read_committed, manual commits, 16 MiB+ messages. Contains secrets."""
    conf = settings.as_librdkafka()
    conf.update(
        {
            "group.id": group_id,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": False,
            # KIP-74: the first batch is returned even when larger, but keep room for 16 MiB messages anyway.
            "max.partition.fetch.bytes": 32 * MiB,
            "fetch.max.bytes": 64 * MiB,
            "receive.message.max.bytes": 64 * MiB + 1024,
            "session.timeout.ms": 10_000,
            "heartbeat.interval.ms": 1_000,
            "logger": LIBRDKAFKA_LOGGER,
        }
    )
    conf.update(overrides)
    return conf


@dataclass(frozen=True, slots=True)
class Message(Generic[E]):
    """A decoded event and where it came from."""

    event: E
    topic: str
    partition: int
    offset: int
    key: str | None
    timestamp_ms: int | None
    headers: Mapping[str, bytes] = field(default_factory=dict)


def raw_key(msg: confluent_kafka.Message) -> str | None:
    key = msg.key()
    if key is None:
        return None
    return key.decode("utf-8", errors="replace") if isinstance(key, bytes) else str(key)


def raw_timestamp(msg: confluent_kafka.Message) -> int | None:
    kind, ts = msg.timestamp()
    return int(ts) if kind != confluent_kafka.TIMESTAMP_NOT_AVAILABLE else None


# The header of a transactional processor's seal records (``eventbus.transactional``, "Sealing"). They are always
# aborted, so a read_committed reader never gets one; a read_uncommitted reader skips them: they are not events.
SEAL_HEADER = "floe-seal"


def is_seal(headers: Mapping[str, Any] | Sequence[tuple[str, Any]] | None) -> bool:
    """Whether a record with these headers (confluent-kafka's list or dict, aiokafka's sequence) is a seal."""
    if isinstance(headers, Mapping):
        return SEAL_HEADER in headers
    return any(name == SEAL_HEADER for name, _ in headers or ())


def raw_headers(msg: confluent_kafka.Message) -> dict[str, bytes]:
    return {h[0]: h[1] for h in (msg.headers() or []) if isinstance(h[1], bytes)}


def dead_letter_for(msg: confluent_kafka.Message, exc: BaseException, group_id: str | None) -> DeadLetter:
    value = msg.value() or b""
    return DeadLetter(
        source_topic=msg.topic() or "",
        partition=msg.partition() or 0,
        offset=msg.offset() or 0,
        key=raw_key(msg),
        value_b64=base64.b64encode(value).decode(),
        error_type=type(exc).__name__,
        reason=str(exc)[:4000],
        consumer_group=group_id,
    )


class _Offsets:
    """Per-partition commit bookkeeping, so dead-lettered offsets are committed without skipping live ones.

    ``next_commit[tp]``: the offset our last commit (or the assignment) left the group at, i.e. the first offset not
    known to be handled. ``poisoned[tp]``: dead-lettered offsets at or above it.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.next_commit: dict[tuple[str, int], int] = {}
        self.poisoned: dict[tuple[str, int], set[int]] = {}
        self.handed_out: dict[tuple[str, int], int] = {}

    def reset(self, tps: Sequence[tuple[str, int]]) -> None:
        with self.lock:
            for tp in tps:
                self.next_commit.pop(tp, None)
                self.poisoned.pop(tp, None)
                self.handed_out.pop(tp, None)

    def seen(self, tp: tuple[str, int], offset: int) -> None:
        """The first message fetched after an assignment tells where the group's committed offset is."""
        with self.lock:
            self.next_commit.setdefault(tp, offset)

    def target_after(self, tp: tuple[str, int], offset: int) -> int:
        """The offset to commit once ``offset`` is handled: past it and any dead-lettered offsets right after."""
        with self.lock:
            target = offset + 1
            poisoned = self.poisoned.get(tp, set())
            while target in poisoned:
                poisoned.discard(target)
                target += 1
            return target

    def committed(self, tp: tuple[str, int], offset: int) -> None:
        with self.lock:
            if offset > self.next_commit.get(tp, -1):
                self.next_commit[tp] = offset
            poisoned = self.poisoned.get(tp)
            if poisoned:
                self.poisoned[tp] = {o for o in poisoned if o >= offset}


class Consumer(Generic[E]):
    """Consume decoded events of ``topics`` as member of ``group_id``; see the module docstring."""

    def __init__(
        self,
        settings: KafkaSettings,
        topics: Sequence[Topic[E]],
        group_id: str,
        *,
        dead_letter: Topic[DeadLetter] | None = DEAD_LETTER,
        group_instance_id: str | None = None,
        auto_offset_reset: Literal["earliest", "latest"] = "earliest",
        max_batch: int = 500,
        poll_timeout_s: float = 0.2,
        config: Mapping[str, Any] | None = None,
        registry: CollectorRegistry | None = None,
        rejoin_after_s: float | None = 30.0,
        sole_member: bool = False,
    ) -> None:
        if not topics:
            raise ValueError("Consumer needs at least one topic")
        self._settings = settings
        self._topics: dict[str, Topic[E]] = {t.name: t for t in topics}
        self._group_id = group_id
        self._dead_letter = dead_letter
        overrides: dict[str, Any] = {"auto.offset.reset": auto_offset_reset, **dict(config or {})}
        if group_instance_id is not None:
            overrides["group.instance.id"] = group_instance_id
        self._conf = consumer_config(settings, group_id, **overrides)
        self._max_batch = max_batch
        self._poll_timeout_s = poll_timeout_s
        self._registry = registry
        self._metrics = bus_metrics(registry)
        self._consumer: confluent_kafka.Consumer | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._buffer: deque[confluent_kafka.Message] = deque()
        self._offsets = _Offsets()
        self._dlq_producer: Producer | None = None
        self._closed = False
        self._membership = Membership(settings, group_id, rejoin_after_s, sole_member=sole_member)
        self._abandoned: list[confluent_kafka.Consumer] = []  # clients that would not close; kept, never used
        self.rejoins = 0

    # ------------------------------------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> Consumer[E]:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def start(self) -> None:
        if self._consumer is not None:
            return
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="floe-consumer")
        conf = {**self._conf, "error_cb": self._on_error}

        def create() -> confluent_kafka.Consumer:
            with map_kafka_errors("create consumer"):
                consumer = confluent_kafka.Consumer(conf)
                consumer.subscribe(
                    list(self._topics), on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_revoke
                )
            return consumer

        self._consumer = await self._call(create)
        self._membership.restart()
        log.info("consumer started", group_id=self._group_id, topics=list(self._topics))

    async def _rejoin_if_dropped(self) -> None:
        """Replace the librdkafka client with a new member of the same group if ``Membership`` says it was dropped
        (see ``rejoin_after_s``). Only called with nothing owned, so no partition's bookkeeping is lost."""
        if not await self._membership.dropped(lambda: self._call(self._require().memberid)):
            return
        log.warning(
            "consumer owned no partition for too long; rejoining its group as a new member",
            group_id=self._group_id,
            seconds=round(self._membership.seconds(), 1),
        )
        old, old_executor = self._consumer, self._executor
        self._consumer = self._executor = None
        if old is not None and old_executor is not None:
            if not await close_within(old, old_executor):
                self._abandoned.append(old)
            old_executor.shutdown(wait=False)
        self._buffer.clear()
        self.rejoins += 1
        self._metrics.rejoins.labels(self._group_id).inc()
        await self.start()

    async def close(self) -> None:
        self._closed = True
        consumer, self._consumer = self._consumer, None
        try:
            if consumer is not None:
                await self._call(consumer.close)
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=False)
                self._executor = None
            if self._dlq_producer is not None:
                await self._dlq_producer.close()
                self._dlq_producer = None

    # ------------------------------------------------------------------------------------------ consuming

    def __aiter__(self) -> AsyncIterator[Message[E]]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Message[E]]:
        while not self._closed:
            msg = await self.next(timeout_s=None)
            if msg is not None:
                yield msg

    async def next(self, timeout_s: float | None = 1.0) -> Message[E] | None:
        """The next decoded message, or None if none arrived within ``timeout_s`` (None: wait forever)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while True:
            if not self._buffer:
                if self._closed:
                    return None
                if self._membership.due():
                    await self._rejoin_if_dropped()
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    return None
                wait = self._poll_timeout_s if remaining is None else max(0.0, min(self._poll_timeout_s, remaining))
                self._buffer.extend(await self._call(self._fetch, wait))
                continue
            raw = self._buffer.popleft()
            decoded = await self._decode(raw)
            if decoded is not None:
                return decoded

    def _fetch(self, timeout: float) -> list[confluent_kafka.Message]:
        consumer = self._require()
        # poll() returns as soon as one message is there; consume(..., 0) then drains what is already fetched.
        first = consumer.poll(timeout)
        if first is None:
            return []
        return [first, *consumer.consume(self._max_batch - 1, 0)]

    async def _decode(self, raw: confluent_kafka.Message) -> Message[E] | None:
        err = raw.error()
        if err is not None:
            self._raise_or_log(err)
            return None
        name = raw.topic() or ""
        tp = (name, raw.partition() or 0)
        offset = raw.offset() or 0
        self._offsets.seen(tp, offset)
        if is_seal(raw.headers()):
            await self._commit_past_poison(name, tp[1], offset)
            return None
        topic = self._topics[name]
        value = raw.value()
        try:
            if value is None:
                raise SerializationFailed("empty message (tombstone) on an event topic")
            event = decode(topic.model, value)
        except (ContractError, SerializationFailed) as exc:
            await self._send_to_dead_letter(raw, exc)
            return None
        self._metrics.consumed.labels(name).inc()
        self._offsets.handed_out[tp] = offset
        headers = raw_headers(raw)
        return Message(event, name, tp[1], offset, raw_key(raw), raw_timestamp(raw), headers)

    def _raise_or_log(self, err: KafkaError) -> None:
        mapped = from_kafka_error(err, f"consume {','.join(self._topics)}")
        if mapped.retriable and not err.fatal():
            log.warning("consumer transient error", error=str(mapped), code=mapped.code)
            return
        raise mapped

    async def _send_to_dead_letter(self, raw: confluent_kafka.Message, exc: BaseException) -> None:
        name, partition, offset = raw.topic() or "", raw.partition() or 0, raw.offset() or 0
        log.warning(
            "poison message dead-lettered",
            topic=name,
            partition=partition,
            offset=offset,
            where=f"{name}[{partition}]@{offset}",
            error_type=type(exc).__name__,
            reason=str(exc)[:500],
        )
        if self._dead_letter is None:
            raise SerializationFailed(
                f"{name}[{partition}]@{offset} does not decode and no dead-letter topic is set"
            ) from exc
        if name == self._dead_letter.name:
            # Re-dead-lettering a broken dead letter would feed it back to ourselves forever: log it, move past it.
            log.error("undecodable dead letter skipped", where=f"{name}[{partition}]@{offset}")
            await self._commit_past_poison(name, partition, offset)
            return
        if self._dlq_producer is None:
            self._dlq_producer = Producer(self._settings, registry=self._registry)
            await self._dlq_producer.start()
        await self._dlq_producer.send(self._dead_letter, dead_letter_for(raw, exc, self._group_id))
        self._metrics.dead_lettered.labels(name).inc()
        await self._commit_past_poison(name, partition, offset)

    async def _commit_past_poison(self, name: str, partition: int, offset: int) -> None:
        tp = (name, partition)
        with self._offsets.lock:
            at_front = self._offsets.next_commit.get(tp) == offset
            if not at_front:
                self._offsets.poisoned.setdefault(tp, set()).add(offset)
        if at_front:
            # Everything before it is committed: commit past it now, so it is not dead-lettered again on restart.
            await self._commit_offsets([(name, partition, offset + 1)])

    # -------------------------------------------------------------------------------------------- commits

    async def commit(self, msg: Message[Any] | None = None) -> None:
        """Commit ``msg`` (its offset + 1) or, without an argument, every message handed out so far."""
        if msg is not None:
            tp = (msg.topic, msg.partition)
            targets = [(msg.topic, msg.partition, self._offsets.target_after(tp, msg.offset))]
        else:
            targets = [
                (tp[0], tp[1], self._offsets.target_after(tp, off))
                for tp, off in list(self._offsets.handed_out.items())
            ]
        if targets:
            await self._commit_offsets(targets)

    async def _commit_offsets(self, targets: list[tuple[str, int, int]]) -> None:
        consumer = self._require()
        tps = [TopicPartition(t, p, o) for t, p, o in targets]

        def do_commit() -> list[TopicPartition] | None:
            with map_kafka_errors("commit offsets"):
                return consumer.commit(offsets=tps, asynchronous=False)

        result = await self._call(do_commit)
        for tp in result or []:
            if tp.error is not None:
                raise from_kafka_error(tp.error, f"commit {tp.topic}[{tp.partition}]")
        for t, p, o in targets:
            self._offsets.committed((t, p), o)
            self._metrics.committed.labels(t).inc()

    # ------------------------------------------------------------------------------------------- internals

    def _require(self) -> confluent_kafka.Consumer:
        if self._consumer is None:
            raise ClientStateError("consumer is not started (use `async with Consumer(...) as consumer`)")
        return self._consumer

    async def _call(self, fn: Any, *args: Any) -> Any:
        if self._executor is None:
            raise ClientStateError("consumer is closed")
        return await asyncio.get_running_loop().run_in_executor(self._executor, partial(fn, *args))

    def _on_assign(self, consumer: confluent_kafka.Consumer, partitions: list[TopicPartition]) -> None:
        self._offsets.reset([(p.topic, p.partition) for p in partitions])
        self._membership.assigned({(p.topic, p.partition) for p in partitions})
        log.info(
            "partitions assigned", group_id=self._group_id, partitions=[f"{p.topic}[{p.partition}]" for p in partitions]
        )

    def _on_revoke(self, consumer: confluent_kafka.Consumer, partitions: list[TopicPartition]) -> None:
        revoked = {(p.topic, p.partition) for p in partitions}
        self._offsets.reset(list(revoked))
        self._membership.revoked(revoked)
        # Fetched but not handed out: the next owner reads them from the committed offset. Filtered in place:
        # ``next()`` may hold a bound ``self._buffer.extend`` across this callback, so the deque must stay the same.
        kept = [m for m in self._buffer if (m.topic(), m.partition()) not in revoked]
        self._buffer.clear()
        self._buffer.extend(kept)
        log.info("partitions revoked", group_id=self._group_id, partitions=[f"{t}[{p}]" for t, p in sorted(revoked)])

    def _on_error(self, err: KafkaError) -> None:
        if err.fatal():
            log.error("consumer fatal error", error=err.str(), code=err.name())
        else:
            line = f"consumer {err.name()} {err.str()}"
            KAFKA_LINES.emit(log.warning, line, "consumer client error", error=err.str(), code=err.name())
