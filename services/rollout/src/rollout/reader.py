"""Read topics from the beginning up to their current end, without a committed position (pure eventbus API).

Used to rebuild the service's state after a restart and by ``replay-rebuild``. A throw-away consumer group that never
commits reads every partition from its start; reading stops when every non-empty partition reached the high watermark
it had when reading began, or after ``idle_s`` without a message (the last offsets of a partition are often
transaction markers, which are never delivered). Messages that arrive meanwhile may be included: callers are
idempotent. Undecodable messages are skipped and counted (the live consumers already dead-lettered them), so reading
never writes to any topic.

Limit: cost is linear in what the topics retain.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import structlog

from contracts import Topic
from eventbus import Consumer, KafkaSettings, Message, SerializationFailed, describe_topics

__all__ = ["read_to_end"]

log = structlog.get_logger()


async def read_to_end(
    settings: KafkaSettings, topics: Sequence[Topic[Any]], *, idle_s: float = 1.0
) -> AsyncIterator[Message[Any]]:
    infos = await asyncio.to_thread(describe_topics, settings, [t.name for t in topics])
    remaining = {
        (info.name, partition): high
        for info in infos
        for partition, (low, high) in info.watermarks.items()
        if high > low
    }
    if not remaining:
        return
    skipped = 0
    async with Consumer(settings, list(topics), group_id=f"floe-reader-{uuid.uuid4().hex}", dead_letter=None) as c:
        while remaining:
            try:
                msg = await c.next(timeout_s=idle_s)
            except SerializationFailed:
                skipped += 1
                continue
            if msg is None:
                break
            high = remaining.get((msg.topic, msg.partition))
            if high is not None and msg.offset >= high - 1:
                del remaining[(msg.topic, msg.partition)]
            yield msg
    if skipped:
        log.warning("undecodable messages skipped while reading", count=skipped)
