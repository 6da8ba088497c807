"""Follow topics from their beginning and on, without a consumer group: a state rebuild that never stops.

``Follower`` assigns every partition of its topics at the beginning (``read_committed``, nothing committed, so no
consumer group is touched) and hands out decoded records as they come; ``caught_up`` turns true once it has read
up to the end offsets seen when it started (or nothing moved for ``idle_timeout_s``: an open transaction of another
producer holds the stable offset back; its records come later anyway). The rollout leader uses it for the
scheduling inputs, which it needs from *every* partition while the partitions themselves are shared out among the
rollout shards.

Like every librdkafka client here, the consumer lives on one dedicated thread. Records that do not decode are
returned with ``error`` set (as ``replay`` does); the caller skips them (the owning consumer dead-letters them).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import confluent_kafka
from confluent_kafka import TopicPartition

from contracts import Topic
from eventbus.admin import _watermarks
from eventbus.consumer import is_seal
from eventbus.errors import ClientStateError, TopicMissing, from_kafka_error, map_kafka_errors
from eventbus.replay import ReplayRecord, reader_conf, to_record
from eventbus.settings import KafkaSettings

__all__ = ["Follower"]

MiB = 1024 * 1024


class Follower:
    def __init__(self, settings: KafkaSettings, topics: Sequence[Topic[Any]], *, idle_timeout_s: float = 1.0) -> None:
        self._settings = settings
        self._models = {t.name: t.model for t in topics}
        self._idle_timeout_s = idle_timeout_s
        self._consumer: confluent_kafka.Consumer | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._stop: dict[tuple[str, int], int] = {}
        self._behind: set[tuple[str, int]] = set()
        self._last_progress = time.monotonic()
        self.caught_up = False

    async def __aenter__(self) -> Follower:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="floe-follow")
        await self._call(self._start_sync)

    def _start_sync(self) -> None:
        conf = reader_conf(self._settings, "floe-follow")
        timeout = self._settings.admin_timeout_s
        with map_kafka_errors("follow: create consumer"):
            consumer = confluent_kafka.Consumer(conf)
        assign: list[TopicPartition] = []
        for name in self._models:
            with map_kafka_errors(f"follow {name}: metadata"):
                meta = consumer.list_topics(name, timeout=timeout).topics.get(name)
            if meta is None or meta.error is not None or not meta.partitions:
                consumer.close()
                raise TopicMissing(f"topic {name} does not exist")
            for p in sorted(meta.partitions):
                low, high = _watermarks(consumer, TopicPartition(name, p), timeout)
                self._stop[(name, p)] = high
                if low < high:
                    self._behind.add((name, p))
                assign.append(TopicPartition(name, p, confluent_kafka.OFFSET_BEGINNING))
        with map_kafka_errors("follow: assign"):
            consumer.assign(assign)
        self._consumer = consumer
        self._last_progress = time.monotonic()
        self.caught_up = not self._behind

    async def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None and self._executor is not None:
            await self._call_with(consumer.close)
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None

    async def poll(self, max_records: int = 1000, timeout_s: float = 0.0) -> list[ReplayRecord]:
        """The records fetched so far (up to ``max_records``, waiting up to ``timeout_s`` for the first)."""
        return list(await self._call(self._poll_sync, max_records, timeout_s))

    def _poll_sync(self, max_records: int, timeout_s: float) -> list[ReplayRecord]:
        consumer = self._consumer
        if consumer is None:
            raise ClientStateError("follower is closed")
        with map_kafka_errors("follow: poll"):
            msgs = consumer.consume(max_records, timeout_s)
        out: list[ReplayRecord] = []
        for msg in msgs:
            err = msg.error()
            if err is not None:
                mapped = from_kafka_error(err, "follow")
                if mapped.retriable:
                    continue
                raise mapped
            if not is_seal(msg.headers()):
                out.append(to_record(msg, self._models[msg.topic() or ""]))
        if out:
            self._last_progress = time.monotonic()
        if not self.caught_up:
            self._check_caught_up(consumer)
        return out

    def _check_caught_up(self, consumer: confluent_kafka.Consumer) -> None:
        # Positions, not offsets seen: transaction markers and aborted records occupy offsets never handed out.
        with map_kafka_errors("follow: position"):
            for tp in consumer.position([TopicPartition(n, p) for n, p in self._behind]):
                if tp.offset >= self._stop[(tp.topic, tp.partition)]:
                    self._behind.discard((tp.topic, tp.partition))
                    self._last_progress = time.monotonic()
        if not self._behind or time.monotonic() - self._last_progress > self._idle_timeout_s:
            self.caught_up = True

    async def _call(self, fn: Any, *args: Any) -> Any:
        if self._executor is None:
            raise ClientStateError("follower is not started")
        return await self._call_with(fn, *args)

    async def _call_with(self, fn: Any, *args: Any) -> Any:
        assert self._executor is not None
        return await asyncio.get_running_loop().run_in_executor(self._executor, partial(fn, *args))
