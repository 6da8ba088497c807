"""The same consumer on aiokafka: asyncio-native, for read-only followers (the dashboard).

``AioConsumer`` has ``Consumer``'s interface (``async with``, ``async for``, ``next``, ``commit``) and its rules:
``read_committed``, no auto-commit, every value decoded with its topic's contract (``contracts.decode``), a message
that does not decode published once to the dead-letter topic and skipped. What differs is the client: aiokafka
speaks the Kafka protocol in Python on the event loop, with no C library and no worker thread. The point is the one
``docs/kafka.md`` makes: services share the wire contract, not a client library, so a service can swap its client
and still read what the confluent-kafka (librdkafka) producers wrote, transactions and lz4 batches included.

What it leaves out, because a read-only follower has no use for it: transactions, static membership, and the
rejoin watchdog of ``Consumer``. Its dead letters go out through aiokafka's own idempotent producer, keyed and
headed like ``Producer``'s, and it commits past a poison message at once: it is meant for followers that are done
with each message before they ask for the next (``Consumer`` keeps per-partition bookkeeping for the others).
"""

from __future__ import annotations

import base64
import ssl
from collections.abc import AsyncIterator, Sequence
from types import TracebackType
from typing import Any, Generic, Literal, TypeVar

import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaConnectionError, KafkaError

from contracts import DEAD_LETTER, DeadLetter, Event, Topic, decode, encode
from contracts.errors import ContractError
from eventbus.consumer import Message, is_seal
from eventbus.errors import BrokerUnavailable, ClientStateError, ConfigurationError, KafkaFailure, SerializationFailed
from eventbus.producer import event_headers
from eventbus.settings import KafkaSettings

__all__ = ["AioConsumer", "aiokafka_config"]

log = structlog.get_logger()

E = TypeVar("E", bound=Event)
MiB = 1024 * 1024


def aiokafka_config(settings: KafkaSettings) -> dict[str, Any]:
    """``KafkaSettings`` as aiokafka keyword arguments (bootstrap, identity, security). Contains secrets."""
    conf: dict[str, Any] = {
        "bootstrap_servers": settings.bootstrap_servers,
        "client_id": settings.client_id,
        "security_protocol": settings.security_protocol,
    }
    if settings.sasl_mechanism == "OAUTHBEARER":
        raise ConfigurationError("the aiokafka consumer has no OAUTHBEARER token provider: use PLAIN or SCRAM")
    if settings.sasl_mechanism is not None:
        conf["sasl_mechanism"] = settings.sasl_mechanism
        conf["sasl_plain_username"] = settings.sasl_username
        conf["sasl_plain_password"] = settings.sasl_password.get_secret_value() if settings.sasl_password else None
    if settings.security_protocol in ("SSL", "SASL_SSL"):
        context = ssl.create_default_context(cafile=settings.ssl_ca_location)
        if settings.ssl_certificate_location is not None:
            password = settings.ssl_key_password.get_secret_value() if settings.ssl_key_password else None
            context.load_cert_chain(settings.ssl_certificate_location, settings.ssl_key_location, password)
        context.check_hostname = settings.ssl_endpoint_identification
        conf["ssl_context"] = context
    return conf


class AioConsumer(Generic[E]):
    """Consume decoded events of ``topics`` as member of ``group_id`` with aiokafka; see the module docstring."""

    def __init__(
        self,
        settings: KafkaSettings,
        topics: Sequence[Topic[E]],
        group_id: str,
        *,
        dead_letter: Topic[DeadLetter] | None = DEAD_LETTER,
        auto_offset_reset: Literal["earliest", "latest"] = "earliest",
        max_batch: int = 500,
    ) -> None:
        if not topics:
            raise ValueError("AioConsumer needs at least one topic")
        self._settings = settings
        self._topics: dict[str, Topic[E]] = {t.name: t for t in topics}
        self._group_id = group_id
        self._dead_letter = dead_letter
        self._auto_offset_reset = auto_offset_reset
        self._max_batch = max_batch
        self._consumer: AIOKafkaConsumer | None = None
        self._dlq: AIOKafkaProducer | None = None
        self._buffer: list[ConsumerRecord[bytes, bytes]] = []
        self._handed_out: dict[tuple[str, int], int] = {}
        self._committed: dict[tuple[str, int], int] = {}  # never commit below these (past a poison message)
        self._closed = False

    async def __aenter__(self) -> AioConsumer[E]:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def start(self) -> None:
        if self._consumer is not None:
            return
        consumer = AIOKafkaConsumer(
            *self._topics,
            group_id=self._group_id,
            enable_auto_commit=False,
            auto_offset_reset=self._auto_offset_reset,
            isolation_level="read_committed",
            # The limits of ``Consumer``: room for 16 MiB messages.
            max_partition_fetch_bytes=32 * MiB,
            fetch_max_bytes=64 * MiB,
            session_timeout_ms=10_000,
            heartbeat_interval_ms=1_000,
            **aiokafka_config(self._settings),
        )
        try:
            await consumer.start()
        except KafkaConnectionError as exc:
            await consumer.stop()
            raise BrokerUnavailable(f"cannot reach {self._settings.bootstrap_servers}: {exc}") from exc
        except KafkaError as exc:
            await consumer.stop()
            raise KafkaFailure(f"start consumer: {exc}", code=type(exc).__name__) from exc
        self._consumer = consumer
        log.info("consumer started", group_id=self._group_id, topics=list(self._topics), client="aiokafka")

    async def close(self) -> None:
        self._closed = True
        consumer, self._consumer = self._consumer, None
        dlq, self._dlq = self._dlq, None
        try:
            if consumer is not None:
                await consumer.stop()
        finally:
            if dlq is not None:
                await dlq.stop()

    def __aiter__(self) -> AsyncIterator[Message[E]]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Message[E]]:
        while not self._closed:
            msg = await self.next(timeout_s=None)
            if msg is not None:
                yield msg

    async def next(self, timeout_s: float | None = 1.0) -> Message[E] | None:
        """The next decoded message, or None if none arrived within ``timeout_s`` (None: wait forever)."""
        consumer = self._require()
        while True:
            if not self._buffer:
                if self._closed:
                    return None
                # getmany with no timeout waits for the first record; a timeout returns {} when nothing came.
                batches = await consumer.getmany(
                    timeout_ms=1_000 if timeout_s is None else int(timeout_s * 1000), max_records=self._max_batch
                )
                for records in batches.values():
                    self._buffer.extend(records)
                if not self._buffer:
                    if timeout_s is None:
                        continue
                    return None
            raw = self._buffer.pop(0)
            decoded = await self._decode(raw)
            if decoded is not None:
                return decoded

    async def _decode(self, raw: ConsumerRecord[bytes, bytes]) -> Message[E] | None:
        topic = self._topics[raw.topic]
        if is_seal(raw.headers):
            return None
        try:
            if raw.value is None:
                raise SerializationFailed("empty message (tombstone) on an event topic")
            event = decode(topic.model, raw.value)
        except (ContractError, SerializationFailed) as exc:
            await self._send_to_dead_letter(raw, exc)
            return None
        self._handed_out[(raw.topic, raw.partition)] = raw.offset
        key = raw.key.decode("utf-8", errors="replace") if raw.key is not None else None
        headers = {k: v for k, v in raw.headers if isinstance(v, bytes)}
        return Message(event, raw.topic, raw.partition, raw.offset, key, raw.timestamp, headers)

    async def _send_to_dead_letter(self, raw: ConsumerRecord[bytes, bytes], exc: BaseException) -> None:
        where = f"{raw.topic}[{raw.partition}]@{raw.offset}"
        log.warning("poison message dead-lettered", where=where, error_type=type(exc).__name__, reason=str(exc)[:500])
        if self._dead_letter is None:
            raise SerializationFailed(f"{where} does not decode and no dead-letter topic is set") from exc
        if raw.topic == self._dead_letter.name:
            log.error("undecodable dead letter skipped", where=where)
        else:
            letter = DeadLetter(
                source_topic=raw.topic,
                partition=raw.partition,
                offset=raw.offset,
                key=raw.key.decode("utf-8", errors="replace") if raw.key is not None else None,
                value_b64=base64.b64encode(raw.value or b"").decode(),
                error_type=type(exc).__name__,
                reason=str(exc)[:4000],
                consumer_group=self._group_id,
            )
            if self._dlq is None:
                self._dlq = AIOKafkaProducer(acks="all", enable_idempotence=True, **aiokafka_config(self._settings))
                await self._dlq.start()
            headers = [
                (k, v if isinstance(v, bytes) else (v or "").encode())
                for k, v in event_headers(self._dead_letter, letter)
            ]
            await self._dlq.send_and_wait(
                self._dead_letter.name, encode(letter), key=self._dead_letter.key_of(letter), headers=headers
            )
        # Past the poison at once, so it is dead-lettered once, not on every restart (a follower commits nothing
        # else unless asked: ``commit`` moves it past what it handled).
        await self._commit({(raw.topic, raw.partition): raw.offset + 1})

    async def commit(self, msg: Message[Any] | None = None) -> None:
        """Commit ``msg`` (its offset + 1) or, without an argument, every message handed out so far."""
        if msg is not None:
            await self._commit({(msg.topic, msg.partition): msg.offset + 1})
        else:
            await self._commit({tp: o + 1 for tp, o in self._handed_out.items()})

    async def _commit(self, targets: dict[tuple[str, int], int]) -> None:
        # Kafka accepts a lower offset than the last commit: committing an earlier message after a poison message
        # was committed past would bring the poison back (and dead-letter it again) on the next start.
        offsets = {TopicPartition(t, p): max(o, self._committed.get((t, p), 0)) for (t, p), o in targets.items()}
        if offsets:
            await self._require().commit(offsets)
            for tp, o in offsets.items():
                self._committed[(tp.topic, tp.partition)] = o

    def _require(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            raise ClientStateError("consumer is not started (use `async with AioConsumer(...) as consumer`)")
        return self._consumer
