"""Async, idempotent producer over librdkafka: ``await producer.send(topic, event)`` returns once acked.

Why the sync ``confluent_kafka.Producer`` plus a poll thread (not ``confluent_kafka.aio.AIOProducer``): the sync
client batches and compresses in librdkafka's C threads outside the GIL, supports headers, and one daemon thread
calling ``poll()`` runs the delivery callbacks, which resolve asyncio futures on the caller's loop. ``send()``
itself never blocks the loop (``produce()`` only enqueues; a full local queue is waited out asynchronously).

Guarantees: ``enable.idempotence`` (so ``acks=all`` and no duplicates from internal retries, per partition and
producer session). A resend by the *application* after a crash can still duplicate: consumers dedupe by event id,
or use ``TransactionalProcessor`` for exactly-once stages. Messages up to 64 MiB are accepted client-side; the
topic's ``max.message.bytes`` (16 MiB for the big topics) is the real limit and exceeding it raises
``MessageTooLarge``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import confluent_kafka
import structlog
from prometheus_client import CollectorRegistry

from contracts import Event, Topic, encode
from contracts.errors import ContractError
from eventbus.errors import (
    ClientStateError,
    EventBusError,
    OperationTimeout,
    SerializationFailed,
    from_kafka_error,
    map_exception,
    map_kafka_errors,
)
from eventbus.logging import Repeats
from eventbus.metrics import Children, bus_metrics
from eventbus.settings import KafkaSettings

__all__ = ["LIBRDKAFKA_LOGGER", "Delivery", "Producer", "event_headers", "producer_config"]

log = structlog.get_logger()

MiB = 1024 * 1024
CLIENT_MAX_MESSAGE_BYTES = 64 * MiB


def producer_config(settings: KafkaSettings, **overrides: Any) -> dict[str, Any]:
    """librdkafka producer config: idempotent, acks=all, large-message limits. Contains secrets: never log it."""
    conf = settings.as_librdkafka()
    conf.update(
        {
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            # JSON token-id lists compress ~3x; Arrow payloads are already zstd-compressed and lz4 is cheap on them.
            "compression.type": "lz4",
            "message.max.bytes": CLIENT_MAX_MESSAGE_BYTES,
            "message.timeout.ms": int(settings.delivery_timeout_s * 1000),
            "logger": LIBRDKAFKA_LOGGER,
        }
    )
    conf.update(overrides)
    return conf


def event_headers(topic: Topic[Any], event: Event) -> list[tuple[str, str | bytes | None]]:
    """Headers on every event: its type and schema version, so tools can inspect a topic without decoding it."""
    return [("floe-event", type(event).__name__.encode()), ("floe-schema-version", str(event.schema_version).encode())]


@dataclass(frozen=True, slots=True)
class Delivery:
    """Where the broker stored an event."""

    topic: str
    partition: int
    offset: int
    size: int = 0  # bytes of the value as produced (so a caller need not encode the event again to count them)


class Producer:
    """``async with Producer(settings) as p: await p.send(topic, event)``.

    One instance per process is enough (it is safe to ``send`` from many tasks at once). ``close()`` flushes
    pending messages before stopping.
    """

    def __init__(
        self,
        settings: KafkaSettings,
        *,
        config: Mapping[str, Any] | None = None,
        registry: CollectorRegistry | None = None,
        flush_timeout_s: float = 30.0,
    ) -> None:
        self._settings = settings
        self._conf = producer_config(settings, **dict(config or {}))
        self._metrics = bus_metrics(registry)
        self._flush_timeout_s = flush_timeout_s
        self._producer: confluent_kafka.Producer | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._fatal: EventBusError | None = None
        self._child = Children()

    # ------------------------------------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> Producer:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def start(self) -> None:
        if self._producer is not None:
            return
        conf = dict(self._conf)
        conf["error_cb"] = self._on_error
        with map_kafka_errors("create producer"):
            self._producer = confluent_kafka.Producer(conf)
        self._stop.clear()
        self._thread = threading.Thread(target=self._poll_loop, name="floe-producer-poll", daemon=True)
        self._thread.start()
        log.info("producer started", bootstrap=self._settings.bootstrap_servers)

    async def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is None:
            return
        self._stop.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
        # flush() serves the remaining delivery callbacks, so pending send() calls resolve (or fail) before we go.
        left = await asyncio.to_thread(producer.flush, self._flush_timeout_s)
        if left:
            log.warning("producer closed with undelivered messages", undelivered=left)

    async def flush(self, timeout_s: float | None = None) -> None:
        """Wait until every queued message is acknowledged (or raise ``OperationTimeout``)."""
        producer = self._require()
        left = await asyncio.to_thread(producer.flush, self._flush_timeout_s if timeout_s is None else timeout_s)
        if left:
            raise OperationTimeout(f"{left} message(s) still undelivered after flush timeout")

    # ------------------------------------------------------------------------------------------------ send

    async def send(
        self,
        topic: Topic[Any],
        event: Event,
        *,
        key: bytes | str | None = None,
        headers: Mapping[str, bytes] | None = None,
        partition: int | None = None,
    ) -> Delivery:
        """Encode ``event`` for ``topic``, produce it and wait until the broker acknowledged it (acks=all).

        The key defaults to the topic's key field (e.g. ``session_id``), so a session's events stay in order;
        ``partition`` overrides the key's partition (replays and tests).
        """
        producer = self._require()
        value = encode_for(topic, event)
        k = topic.key_of(event) if key is None else (key.encode() if isinstance(key, str) else key)
        hdrs: list[tuple[str, str | bytes | None]] = [*event_headers(topic, event), *(headers or {}).items()]
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Delivery] = loop.create_future()
        started = time.perf_counter()

        def on_delivery(err: confluent_kafka.KafkaError | None, msg: confluent_kafka.Message) -> None:
            # Runs on the poll thread: hand the result to the caller's loop.
            if err is not None:
                result: Delivery | EventBusError = from_kafka_error(err, f"deliver to {topic.name}")
            else:
                result = Delivery(msg.topic() or topic.name, msg.partition() or 0, msg.offset() or 0, len(value))
            # RuntimeError: the loop is closed, nobody is waiting any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_settle, fut, result)

        await self._produce(producer, topic.name, value, k, hdrs, on_delivery, partition)
        delivery = await fut
        self._child(self._metrics.produced, topic.name).inc()
        self._child(self._metrics.produce_seconds, topic.name).observe(time.perf_counter() - started)
        return delivery

    async def _produce(
        self,
        producer: confluent_kafka.Producer,
        topic: str,
        value: bytes,
        key: bytes,
        headers: list[tuple[str, str | bytes | None]],
        on_delivery: Any,
        partition: int | None,
    ) -> None:
        deadline = time.monotonic() + self._settings.delivery_timeout_s
        while True:
            if self._fatal is not None:
                raise self._fatal
            try:
                if partition is None:
                    producer.produce(topic, value, key, headers=headers, on_delivery=on_delivery)
                else:
                    producer.produce(topic, value, key, partition, headers=headers, on_delivery=on_delivery)
                return
            except BufferError:
                pass
            except Exception as exc:
                mapped = map_exception(exc, f"produce to {topic}")
                if mapped is None:
                    raise
                raise mapped from exc
            # The local queue is full: wait for deliveries to drain it, without blocking the event loop.
            if time.monotonic() > deadline:
                raise OperationTimeout(f"produce to {topic}: local queue stayed full")
            await asyncio.sleep(0.01)

    # ------------------------------------------------------------------------------------------- internals

    def _require(self) -> confluent_kafka.Producer:
        if self._producer is None:
            raise ClientStateError("producer is not started (use `async with Producer(settings) as producer`)")
        if self._fatal is not None:
            raise self._fatal
        return self._producer

    def _poll_loop(self) -> None:
        producer = self._producer
        assert producer is not None
        while not self._stop.is_set():
            producer.poll(0.1)

    def _on_error(self, err: confluent_kafka.KafkaError) -> None:
        mapped = from_kafka_error(err, "producer")
        if err.fatal():
            self._fatal = mapped
            log.error("producer fatal error", error=str(mapped), code=mapped.code)
        else:
            # Transport hiccups are reported here and retried by librdkafka; deliveries fail only at their timeout.
            line = f"producer {mapped.code} {mapped}"
            KAFKA_LINES.emit(log.warning, line, "producer client error", error=str(mapped), code=mapped.code)


def encode_for(topic: Topic[Any], event: Event) -> bytes:
    """Check that ``event`` belongs on ``topic`` and encode it (``SerializationFailed`` otherwise)."""
    if not isinstance(event, topic.model):
        raise SerializationFailed(f"topic {topic.name} carries {topic.model.__name__}, got {type(event).__name__}")
    try:
        return encode(event)
    except (ContractError, ValueError, TypeError) as exc:
        raise SerializationFailed(f"cannot encode {type(event).__name__} for {topic.name}: {exc}") from exc


def _settle(fut: asyncio.Future[Delivery], result: Delivery | EventBusError) -> None:
    if fut.done():
        return
    if isinstance(result, EventBusError):
        fut.set_exception(result)
    else:
        fut.set_result(result)


# The Kafka clients' lines (librdkafka's log, the clients' error reports): a line repeated within 10 s, such as every
# failed reconnect while a broker is down, is counted, not written.
KAFKA_LINES = Repeats()


class _LibrdkafkaLogger:
    """librdkafka log lines into structlog, with a constant message (confluent_kafka passes Python log levels)."""

    def log(self, level: int, fmt: str, *args: object) -> None:
        text = fmt % args if args else fmt
        if level >= 40:
            KAFKA_LINES.emit(log.error, text, "librdkafka", detail=text)
        elif level >= 30:
            KAFKA_LINES.emit(log.warning, text, "librdkafka", detail=text)
        else:
            # Debug lines exist only when FLOE_KAFKA_DEBUG asked for them: all of them, at the service's usual level.
            log.info("librdkafka", detail=text)


LIBRDKAFKA_LOGGER = _LibrdkafkaLogger()
