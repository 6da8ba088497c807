"""Exactly-once consume → produce: output events and input offsets commit in ONE Kafka transaction.

::

    async with TransactionalProcessor(settings, [SESSIONS_FINISHED], group_id="scorer",
                                      transactional_id="scorer-0") as tp:
        async for batch in tp.batches():          # list[Message]: decoded input, in partition order
            for msg in batch:
                tp.produce(REWARDS, grade(msg.event))   # enqueued inside the open transaction
            await tp.commit(batch)                 # outputs + input offsets, atomically

How it works (librdkafka transactions with KIP-447):

- Each non-empty poll opens a transaction. ``commit`` sends the batch's next offsets with the consumer's
  *group metadata* (generation + member id, so a zombie from an older generation is fenced) and commits. Readers
  with ``isolation.level=read_committed`` (every eventbus ``Consumer``) see the outputs exactly once.
- ``transactional_id`` must be STABLE per processor instance (e.g. ``"scorer-0"``): on restart,
  ``init_transactions`` fences the previous incarnation and aborts its open transaction at once, instead of leaving
  readers blocked until ``transaction.timeout.ms``. By default the same string is used as the consumer's static
  ``group.instance.id``, so a restarted instance takes its partitions back without a session timeout.
- Abortable errors (a failed produce, a broker-side abort): the transaction is aborted, the consumer rewinds to the
  committed offsets and ``commit`` returns False; the next batches re-deliver the same input. Fatal errors
  (``ProducerFenced``: another instance owns the transactional id) are raised: the process must stop.
- Poison input (does not decode) is published to the dead-letter topic *inside* the transaction, so it too is
  dead-lettered exactly once.
- An exception escaping the ``async with`` body aborts the open transaction.
- Sealing: whenever a producer is created for the transactional id (start, or replacing a hung one), one
  transaction writes a throwaway record to every partition of the declared ``outputs`` (and the dead-letter topic)
  and to the group's offsets, and is aborted. Its abort marker ends whatever this producer id still has open on those
  partitions. A single-node broker can leave such a *hung* transaction behind: when it restarts, its transaction
  coordinator finishes transactions whose partitions have no leader for a moment without writing their markers, so
  the partitions' stable offset stops there for every ``read_committed`` reader and no timeout ends it (only the same
  producer id can; docs/kafka.md, "Hung transactions"). The hung outputs are aborted, as ``kafka-transactions.sh abort``
  would; the stages rebuild from the topics, and the input comes again from the committed offsets.
- ``rejoin_after_s``: a processor that has owned no partition that long asks the group's coordinator whether it is
  still a member; if the group has settled without it (librdkafka dropped it after a broker restart and will not
  join again: ``eventbus.membership``), its consumer is replaced by a new member. A listed standby is left alone.

Limits: one transaction at a time; ``commit`` each batch before asking for the next (``ClientStateError``
otherwise). Handlers must be deterministic enough that re-processing an aborted batch is correct.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from types import TracebackType
from typing import Any, Generic, TypeVar

import confluent_kafka
import structlog
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from prometheus_client import CollectorRegistry

from contracts import DEAD_LETTER, DeadLetter, Event, Topic, decode
from contracts.errors import ContractError
from eventbus.consumer import (
    SEAL_HEADER,
    Message,
    consumer_config,
    dead_letter_for,
    is_seal,
    raw_headers,
    raw_key,
    raw_timestamp,
)
from eventbus.errors import (
    ClientStateError,
    OperationTimeout,
    SerializationFailed,
    from_kafka_error,
    map_exception,
    map_kafka_errors,
)
from eventbus.membership import Membership, close_within
from eventbus.metrics import bus_metrics
from eventbus.producer import encode_for, event_headers, producer_config
from eventbus.settings import KafkaSettings

__all__ = ["TransactionalProcessor"]

log = structlog.get_logger()

E = TypeVar("E", bound=Event)


class TransactionalProcessor(Generic[E]):
    """Exactly-once stage over ``inputs``; see the module docstring for the protocol."""

    def __init__(
        self,
        settings: KafkaSettings,
        inputs: Sequence[Topic[E]],
        group_id: str,
        transactional_id: str,
        *,
        static_membership: bool = True,
        dead_letter: Topic[DeadLetter] | None = DEAD_LETTER,
        outputs: Sequence[Topic[Any]] = (),
        max_batch: int = 100,
        poll_timeout_s: float = 0.2,
        transaction_timeout_s: float = 60.0,
        consumer_overrides: Mapping[str, Any] | None = None,
        producer_overrides: Mapping[str, Any] | None = None,
        registry: CollectorRegistry | None = None,
        rejoin_after_s: float | None = 30.0,
    ) -> None:
        if not inputs:
            raise ValueError("TransactionalProcessor needs at least one input topic")
        self._settings = settings
        self._inputs: dict[str, Topic[E]] = {t.name: t for t in inputs}
        self._group_id = group_id
        self._txn_id = transactional_id
        self._dead_letter = dead_letter
        # Sealed at every new producer (see the module docstring): every topic this processor produces to.
        self._outputs = [t.name for t in outputs] + ([dead_letter.name] if dead_letter is not None else [])
        self.seals = 0
        self._max_batch = max_batch
        self._poll_timeout_s = poll_timeout_s
        self._op_timeout_s = max(settings.admin_timeout_s, 10.0)
        c_over: dict[str, Any] = dict(consumer_overrides or {})
        if static_membership:
            c_over.setdefault("group.instance.id", transactional_id)
        self._c_conf = consumer_config(settings, group_id, **c_over)
        self._p_conf = producer_config(
            settings,
            **{
                "transactional.id": transactional_id,
                "transaction.timeout.ms": int(transaction_timeout_s * 1000),
                # librdkafka requires message.timeout.ms <= transaction.timeout.ms
                "message.timeout.ms": int(min(settings.delivery_timeout_s, transaction_timeout_s) * 1000),
                **dict(producer_overrides or {}),
            },
        )
        self._metrics = bus_metrics(registry)
        self._consumer: confluent_kafka.Consumer | None = None
        self._producer: confluent_kafka.Producer | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._open = False
        self._pending: dict[tuple[str, int], int] = {}  # next offset to commit per input partition, this txn
        self._current: list[Message[E]] | None = None
        self._closed = False
        self._abandoned: list[confluent_kafka.Producer] = []  # hung in librdkafka; kept alive, never used again
        # Written by the rebalance callbacks (on the client's thread, inside a poll), read by the event loop: a new
        # frozenset is swapped in, never mutated.
        self._assigned: frozenset[tuple[str, int]] = frozenset()
        self._epoch = 0
        self._membership = Membership(settings, group_id, rejoin_after_s)
        self._abandoned_consumers: list[confluent_kafka.Consumer] = []  # would not close; kept, never used
        self.rejoins = 0

    # ------------------------------------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> TransactionalProcessor[E]:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if self._open:
                log.warning("aborting open transaction on exit", transactional_id=self._txn_id, error=repr(exc))
                await self._call(self._abort_sync, False)
        finally:
            await self.close()

    async def start(self) -> None:
        if self._consumer is not None:
            return
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="floe-txn")

        def create() -> tuple[confluent_kafka.Producer, confluent_kafka.Consumer]:
            with map_kafka_errors(f"init transactions ({self._txn_id})"):
                producer = confluent_kafka.Producer(self._p_conf)
                # Fences older incarnations of this transactional id and aborts their open transaction.
                producer.init_transactions(self._op_timeout_s)
            consumer = self._new_consumer()
            self._seal(producer, consumer)
            return producer, consumer

        self._producer, self._consumer = await self._call(create)
        self._membership.restart()
        log.info("transactional processor started", transactional_id=self._txn_id, group_id=self._group_id)

    def _new_consumer(self) -> confluent_kafka.Consumer:
        with map_kafka_errors(f"create consumer ({self._txn_id})"):
            consumer = confluent_kafka.Consumer(self._c_conf)
            consumer.subscribe(
                list(self._inputs), on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_revoke
            )
        return consumer

    async def _rejoin_if_dropped(self) -> None:
        """Owned nothing for ``rejoin_after_s``: if the group has settled without this member (librdkafka dropped it
        and will not join again, see ``eventbus.membership``), replace the consumer with a new member. A standby
        that the coordinator lists is left alone. Only between transactions: nothing owned, nothing open."""
        consumer = self._consumer
        if self._open or consumer is None or not self._membership.due():
            return
        if not await self._membership.dropped(lambda: self._call(consumer.memberid)):
            return
        log.warning(
            "processor's consumer is not a member of its group; rejoining as a new member",
            transactional_id=self._txn_id,
            group_id=self._group_id,
            seconds=round(self._membership.seconds(), 1),
        )
        self._consumer = None
        assert self._executor is not None  # started: the consumer exists
        if not await close_within(consumer, self._executor):
            # The worker thread may be stuck in the close: the producer goes on with a new one.
            self._abandoned_consumers.append(consumer)
            self._executor.shutdown(wait=False)
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="floe-txn")
        self._assigned = frozenset()
        self._epoch += 1
        self._consumer = await self._call(self._new_consumer)
        self._membership.restart()
        self.rejoins += 1
        self._metrics.rejoins.labels(self._group_id).inc()

    async def close(self) -> None:
        self._closed = True
        consumer, self._consumer = self._consumer, None
        producer, self._producer = self._producer, None
        try:
            if consumer is not None:
                await self._call(consumer.close)
            if producer is not None:
                await self._call(producer.flush, 5.0)
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=False)
                self._executor = None

    # ------------------------------------------------------------------------------------------ assignment

    @property
    def assignment(self) -> frozenset[tuple[str, int]]:
        """The (topic, partition) pairs this member owns now."""
        return self._assigned

    @property
    def assignment_epoch(self) -> int:
        """Bumped on every assignment and revocation. Rebalances happen only inside a poll, i.e. between
        transactions; a stage whose state depends on what it owns compares this before handling each batch."""
        return self._epoch

    def _on_assign(self, consumer: confluent_kafka.Consumer, partitions: list[TopicPartition]) -> None:
        self._assigned = self._assigned | {(tp.topic, tp.partition) for tp in partitions}
        self._membership.assigned({(tp.topic, tp.partition) for tp in partitions})
        self._epoch += 1
        log.info("partitions assigned", transactional_id=self._txn_id, partitions=len(self._assigned))

    def _on_revoke(self, consumer: confluent_kafka.Consumer, partitions: list[TopicPartition]) -> None:
        revoked = {(tp.topic, tp.partition) for tp in partitions}
        self._assigned = self._assigned - revoked
        self._membership.revoked(revoked)
        self._epoch += 1
        log.info("partitions revoked", transactional_id=self._txn_id, partitions=len(partitions))

    # ------------------------------------------------------------------------------------------ consuming

    async def batches(self, timeout_s: float | None = None) -> AsyncIterator[list[Message[E]]]:
        """Yield decoded input batches, each inside a fresh transaction; stop after ``timeout_s`` idle seconds
        (None: run until closed)."""
        idle_since = time.monotonic()
        while not self._closed:
            if self._open:
                raise ClientStateError("commit() or abort() the previous batch before asking for the next one")
            raws = await self._call(self._fetch)
            if not raws:
                await self._rejoin_if_dropped()
                if timeout_s is not None and time.monotonic() - idle_since > timeout_s:
                    return
                continue
            idle_since = time.monotonic()
            batch = await self._call(self._open_transaction, raws)
            if not batch:  # only poison in this chunk: commit the dead letters and the offsets
                await self.commit(batch)
                continue
            self._current = batch
            yield batch

    def _fetch(self) -> list[confluent_kafka.Message]:
        consumer = self._require_consumer()
        first = consumer.poll(self._poll_timeout_s)
        if first is None:
            return []
        raws = [first, *consumer.consume(self._max_batch - 1, 0)]
        # A rebalance inside consume() can revoke the partition of a message fetched before it: its next owner reads
        # it from the committed offset, and committing its offset here would move another member's position.
        owned = self._assigned
        return [m for m in raws if m.error() is not None or (m.topic(), m.partition()) in owned]

    def _open_transaction(self, raws: list[confluent_kafka.Message]) -> list[Message[E]]:
        producer = self._require_producer()
        with map_kafka_errors("begin transaction"):
            producer.begin_transaction()
        self._open = True
        self._pending = {}
        batch: list[Message[E]] = []
        for raw in raws:
            err = raw.error()
            if err is not None:
                mapped = from_kafka_error(err, "transactional consume")
                if mapped.retriable and not err.fatal():
                    log.warning("consumer transient error", error=str(mapped), code=mapped.code)
                    continue
                raise mapped
            name, partition, offset = raw.topic() or "", raw.partition() or 0, raw.offset() or 0
            self._pending[(name, partition)] = offset + 1
            if is_seal(raw.headers()):
                continue
            value = raw.value()
            try:
                if value is None:
                    raise SerializationFailed("empty message (tombstone) on an event topic")
                event = decode(self._inputs[name].model, value)
            except (ContractError, SerializationFailed) as exc:
                self._dead_letter_in_txn(raw, exc)
                continue
            self._metrics.consumed.labels(name).inc()
            headers = raw_headers(raw)
            batch.append(Message(event, name, partition, offset, raw_key(raw), raw_timestamp(raw), headers))
        return batch

    def _dead_letter_in_txn(self, raw: confluent_kafka.Message, exc: BaseException) -> None:
        where = f"{raw.topic()}[{raw.partition()}]@{raw.offset()}"
        log.warning("poison message dead-lettered", where=where, error_type=type(exc).__name__, reason=str(exc)[:500])
        if self._dead_letter is None:
            raise SerializationFailed(f"{where} does not decode and no dead-letter topic is set") from exc
        self.produce(self._dead_letter, dead_letter_for(raw, exc, self._group_id))
        self._metrics.dead_lettered.labels(raw.topic() or "").inc()

    # ------------------------------------------------------------------------------------------- producing

    def produce(self, topic: Topic[Any], event: Event, *, key: bytes | str | None = None) -> None:
        """Enqueue ``event`` inside the open transaction (it becomes visible only when ``commit`` succeeds)."""
        if not self._open:
            raise ClientStateError("produce() is only allowed inside a batch (between batches() and commit())")
        producer = self._require_producer()
        value = encode_for(topic, event)
        k = topic.key_of(event) if key is None else (key.encode() if isinstance(key, str) else key)
        deadline = time.monotonic() + self._settings.delivery_timeout_s
        while True:
            try:
                producer.produce(topic.name, value, k, headers=event_headers(topic, event))
                return
            except BufferError:
                if time.monotonic() > deadline:
                    raise OperationTimeout(f"produce to {topic.name}: local queue stayed full") from None
                producer.poll(0.05)  # serve delivery reports so the queue drains
            except Exception as exc:
                mapped = map_exception(exc, f"produce to {topic.name}")
                if mapped is None:
                    raise
                raise mapped from exc

    async def flush(self) -> None:
        """Wait until the outputs produced so far in the open transaction are written (still uncommitted)."""
        producer = self._require_producer()
        left = await asyncio.to_thread(producer.flush, self._op_timeout_s)
        if left:
            raise OperationTimeout(f"{left} transactional message(s) not written after {self._op_timeout_s}s")

    # ---------------------------------------------------------------------------------------- transactions

    async def commit(self, batch: Sequence[Message[E]] | None = None) -> bool:
        """Commit the open transaction: outputs + the batch's input offsets. False: it was aborted and the input
        rewound (the same messages come again). Raises ``ProducerFenced`` or other fatal errors."""
        if not self._open:
            raise ClientStateError("no open transaction: commit() follows a batch from batches()")
        if (
            batch is not None
            and self._current is not None
            and batch is not self._current
            and list(batch) != self._current
        ):
            raise ClientStateError("commit() got a batch that is not the current one")
        committed = await self._call(self._commit_sync)
        if committed:
            for name, _ in self._pending:
                self._metrics.committed.labels(name).inc()
        self._current = None
        return bool(committed)

    async def abort(self) -> None:
        """Abort the open transaction and rewind the input to the committed offsets."""
        if self._open:
            await self._call(self._abort_sync, True)
        self._current = None

    def _commit_sync(self) -> bool:
        producer, consumer = self._require_producer(), self._require_consumer()
        offsets = [TopicPartition(t, p, o) for (t, p), o in sorted(self._pending.items())]
        attempts = 0
        while True:
            attempts += 1
            try:
                if offsets:
                    if not self._send_offsets_bounded(producer, offsets, consumer.consumer_group_metadata()):
                        self._replace_hung_producer()
                        return False
                    offsets = []  # sent: a retry only needs to repeat the commit
                producer.commit_transaction(self._op_timeout_s)
                self._open = False
                return True
            except KafkaException as exc:
                err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
                if err is not None and err.txn_requires_abort():
                    log.warning("transaction aborted", transactional_id=self._txn_id, error=err.str(), code=err.name())
                    self._abort_sync(True)
                    return False
                if err is not None and err.retriable() and attempts < 5:
                    log.warning("transaction commit retry", transactional_id=self._txn_id, error=err.str())
                    continue
                self._open = False
                mapped = map_exception(exc, f"commit transaction ({self._txn_id})")
                raise (mapped or exc) from exc

    def _send_offsets_bounded(
        self, producer: confluent_kafka.Producer, offsets: list[TopicPartition], group_metadata: Any
    ) -> bool:
        """``send_offsets_to_transaction`` on a throwaway thread; False if it has not returned well past its own
        timeout. librdkafka can block in it forever when the group coordinator went away (a broker restart:
        confluentinc/librdkafka#5456, #5511), which would wedge the whole stage."""
        outcome: list[BaseException | None] = []

        def call() -> None:
            try:
                producer.send_offsets_to_transaction(offsets, group_metadata, self._op_timeout_s)
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        worker = threading.Thread(target=call, name="floe-txn-offsets", daemon=True)
        worker.start()
        worker.join(self._op_timeout_s + 5.0)
        if not outcome:
            return False
        if outcome[0] is not None:
            raise outcome[0]
        return True

    def _replace_hung_producer(self) -> None:
        """Abandon a producer stuck inside librdkafka and start a new one with the same transactional id: its
        ``init_transactions`` fences the stuck one and aborts the open transaction, so the batch's outputs never
        become visible; the input is rewound and comes again (``commit`` returns False)."""
        log.warning("transactional producer hung; replacing it and retrying the batch", transactional_id=self._txn_id)
        if self._producer is not None:
            self._abandoned.append(self._producer)  # destroying it while a thread is inside it would crash
        self._producer = None
        with map_kafka_errors(f"init transactions ({self._txn_id})"):
            producer = confluent_kafka.Producer(self._p_conf)
            producer.init_transactions(self._op_timeout_s)
        self._producer = producer
        self._open = False
        # The lost producer's last transactions are the likeliest to be hung: a broker restart is what hangs it.
        self._seal(producer, self._require_consumer())
        self._rewind()

    def _seal(self, producer: confluent_kafka.Producer, consumer: confluent_kafka.Consumer) -> None:
        """End whatever this producer id has left open on its outputs and its group's offsets: one transaction that
        writes a throwaway record to each of their partitions, aborted (module docstring, "Sealing")."""
        partitions: list[tuple[str, int]] = []
        with map_kafka_errors(f"seal ({self._txn_id}): metadata"):
            for name in self._outputs:
                meta = producer.list_topics(name, timeout=self._op_timeout_s).topics.get(name)
                if meta is None or meta.error is not None:
                    log.warning("output topic missing; not sealed", transactional_id=self._txn_id, topic=name)
                    continue
                partitions.extend((name, p) for p in sorted(meta.partitions))
        with map_kafka_errors(f"seal ({self._txn_id})"):
            producer.begin_transaction()
            wedged = False
            try:
                for name, p in partitions:
                    producer.produce(name, b"", partition=p, headers=[(SEAL_HEADER, b"1")])
                # Registers each partition with the coordinator and writes the records, so the abort marks them.
                left = producer.flush(self._op_timeout_s)
                if left:
                    raise OperationTimeout(f"seal ({self._txn_id}): {left} record(s) not written")
                first = next(iter(self._inputs))
                try:
                    # Adds the group's offsets partition to the transaction: the abort also ends offsets a hung
                    # transaction left pending there, which would keep the group's committed offsets "unstable".
                    # Bounded, as in commit: a replacement's seal follows the very hang that librdkafka can repeat.
                    offsets = [TopicPartition(first, 0, 0)]
                    if not self._send_offsets_bounded(producer, offsets, consumer.consumer_group_metadata()):
                        wedged = True  # still inside librdkafka: no abort on it; the caller gives up this producer
                        raise OperationTimeout(f"seal ({self._txn_id}): sending the group's offsets hung")
                except KafkaException as exc:
                    # The offsets themselves may be refused (this member has not joined yet); the partition is in
                    # the transaction by then, and that is all the abort needs.
                    log.info("seal: offsets not sent", transactional_id=self._txn_id, error=str(exc))
            finally:
                if not wedged:
                    producer.abort_transaction(self._op_timeout_s)
        self.seals += 1
        log.info("transactional outputs sealed", transactional_id=self._txn_id, partitions=len(partitions))

    def _abort_sync(self, rewind: bool) -> None:
        producer = self._require_producer()
        with map_kafka_errors(f"abort transaction ({self._txn_id})"):
            producer.abort_transaction(self._op_timeout_s)
        self._open = False
        if rewind:
            self._rewind()

    def _rewind(self) -> None:
        """Seek every assigned partition back to its committed offset (the start, if none was committed)."""
        consumer = self._require_consumer()
        with map_kafka_errors("rewind to committed offsets"):
            assigned = consumer.assignment()
            if not assigned:
                return
            for tp in consumer.committed(assigned, timeout=self._op_timeout_s):
                offset = tp.offset if tp.offset >= 0 else confluent_kafka.OFFSET_BEGINNING
                consumer.seek(TopicPartition(tp.topic, tp.partition, offset))

    # ------------------------------------------------------------------------------------------- internals

    def _require_consumer(self) -> confluent_kafka.Consumer:
        if self._consumer is None:
            raise ClientStateError("processor is not started (use `async with TransactionalProcessor(...)`)")
        return self._consumer

    def _require_producer(self) -> confluent_kafka.Producer:
        if self._producer is None:
            raise ClientStateError("processor is not started (use `async with TransactionalProcessor(...)`)")
        return self._producer

    async def _call(self, fn: Any, *args: Any) -> Any:
        if self._executor is None:
            raise ClientStateError("processor is closed")
        return await asyncio.get_running_loop().run_in_executor(self._executor, partial(fn, *args))
