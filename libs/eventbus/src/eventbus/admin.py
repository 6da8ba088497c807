"""Topic administration from the contracts registry: create (idempotently), list, describe.

``ensure_topics`` creates every missing topic with the registry's partitions and config, leaves existing ones
alone (it does not alter partitions or config of a live topic: that is an operator's decision), and returns once
the broker serves metadata for every partition, so a producer or consumer started right after sees the topic.
The blocking AdminClient calls run in a worker thread.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import structlog
from confluent_kafka import KafkaError
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported without __all__
    AdminClient,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from contracts import Topic
from eventbus.errors import EventBusError, OperationTimeout, from_kafka_error, map_kafka_errors
from eventbus.producer import LIBRDKAFKA_LOGGER
from eventbus.settings import KafkaSettings

__all__ = [
    "TopicInfo",
    "admin_client",
    "describe_topics",
    "ensure_topics",
    "ensure_topics_sync",
    "list_topics",
    "wait_for_broker",
]

log = structlog.get_logger()


def admin_client(settings: KafkaSettings) -> AdminClient:
    conf: dict[str, Any] = {**settings.as_librdkafka(), "logger": LIBRDKAFKA_LOGGER}
    with map_kafka_errors("create admin client"):
        return AdminClient(conf)


async def ensure_topics(settings: KafkaSettings, topics: Iterable[Topic[Any]]) -> list[str]:
    """Create the missing topics among ``topics``; return the names that were created."""
    return await asyncio.to_thread(ensure_topics_sync, settings, list(topics))


def ensure_topics_sync(settings: KafkaSettings, topics: Iterable[Topic[Any]]) -> list[str]:
    wanted = {t.name: t for t in topics}
    if not wanted:
        return []
    admin = admin_client(settings)
    timeout = settings.admin_timeout_s
    with map_kafka_errors("list topics"):
        existing = set(admin.list_topics(timeout=timeout).topics)
    missing = [t for name, t in wanted.items() if name not in existing]
    created: list[str] = []
    if missing:
        new = [
            NewTopic(
                t.name, num_partitions=t.partitions, replication_factor=settings.replication_factor, config=t.config
            )
            for t in missing
        ]
        with map_kafka_errors("create topics"):
            futures = admin.create_topics(new, operation_timeout=timeout, request_timeout=timeout)
        for name, fut in futures.items():
            try:
                with map_kafka_errors(f"create topic {name}"):
                    fut.result()
                created.append(name)
                log.info("topic created", topic=name, partitions=wanted[name].partitions)
            except Exception as exc:
                # A concurrent creator won the race: that is success for us.
                cause = exc.__cause__ if exc.__cause__ is not None else exc
                err = cause.args[0] if cause.args else None
                if isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    continue
                raise
    _wait_for_partitions(admin, wanted, timeout)
    return created


def _wait_for_partitions(admin: AdminClient, wanted: dict[str, Topic[Any]], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with map_kafka_errors("list topics"):
            meta = admin.list_topics(timeout=timeout).topics
        pending = [
            name
            for name, topic in wanted.items()
            if name not in meta
            or meta[name].error is not None
            or len(meta[name].partitions) < topic.partitions
            or any(p.leader < 0 for p in meta[name].partitions.values())
        ]
        if not pending:
            return
        if time.monotonic() > deadline:
            raise OperationTimeout(f"topics not ready after {timeout}s: {', '.join(sorted(pending))}")
        time.sleep(0.05)


@dataclass(frozen=True)
class TopicInfo:
    """What the broker says about one topic."""

    name: str
    partitions: int
    # partition -> (low watermark, high watermark); filled by describe_topics
    watermarks: dict[int, tuple[int, int]] = field(default_factory=dict)
    config: dict[str, str] = field(default_factory=dict)

    @property
    def messages(self) -> int:
        return sum(high - low for low, high in self.watermarks.values())


def list_topics(settings: KafkaSettings, include_internal: bool = False) -> list[str]:
    admin = admin_client(settings)
    with map_kafka_errors("list topics"):
        names = list(admin.list_topics(timeout=settings.admin_timeout_s).topics)
    return sorted(n for n in names if include_internal or not n.startswith("__"))


def describe_topics(settings: KafkaSettings, names: Iterable[str]) -> list[TopicInfo]:
    """Partitions, watermarks and the non-default config of each topic (``TopicMissing`` for an unknown one)."""
    from confluent_kafka import Consumer, TopicPartition

    names = list(names)
    admin = admin_client(settings)
    timeout = settings.admin_timeout_s
    with map_kafka_errors("list topics"):
        meta = admin.list_topics(timeout=timeout).topics
    for name in names:
        if name not in meta or meta[name].error is not None:
            err = meta[name].error if name in meta else None
            raise from_kafka_error(err or KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART), f"describe {name}")
    resources = [ConfigResource(ResourceType.TOPIC, n) for n in names]
    configs: dict[str, dict[str, str]] = {}
    if resources:
        with map_kafka_errors("describe configs"):
            for res, fut in admin.describe_configs(resources, request_timeout=timeout).items():
                entries = fut.result()
                configs[res.name] = {
                    k: str(v.value) for k, v in entries.items() if not v.is_default and v.value is not None
                }
    # Watermarks need a consumer handle; it never joins a group.
    consumer = Consumer(
        {
            **settings.as_librdkafka(),
            "group.id": "floe-describe",
            "enable.auto.commit": False,
            "logger": LIBRDKAFKA_LOGGER,
        }
    )
    try:
        infos = []
        for name in names:
            marks = {}
            for p in sorted(meta[name].partitions):
                marks[p] = _watermarks(consumer, TopicPartition(name, p), timeout)
            infos.append(TopicInfo(name, len(meta[name].partitions), marks, configs.get(name, {})))
        return infos
    finally:
        consumer.close()


def _watermarks(consumer: Any, tp: Any, timeout: float) -> tuple[int, int]:
    # A partition created a moment ago may not have its leader loaded yet (NOT_LEADER_FOR_PARTITION): retry.
    deadline = time.monotonic() + timeout
    while True:
        try:
            with map_kafka_errors(f"watermarks {tp.topic}[{tp.partition}]"):
                low, high = consumer.get_watermark_offsets(tp, timeout=timeout)
                return int(low), int(high)
        except EventBusError as exc:
            if not exc.retriable or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def wait_for_broker(settings: KafkaSettings, timeout_s: float) -> None:
    """Return once the cluster answers a metadata request (``OperationTimeout`` otherwise)."""
    admin = admin_client(settings)
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        try:
            with map_kafka_errors("metadata"):
                admin.list_topics(timeout=min(2.0, max(0.1, deadline - time.monotonic())))
            return
        except EventBusError as exc:
            last = str(exc)  # a string: keeping the exception would keep the client (and its retries) alive
            time.sleep(0.1)
    del admin
    raise OperationTimeout(f"broker {settings.bootstrap_servers} did not answer within {timeout_s}s: {last}")
