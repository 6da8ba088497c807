"""Hands ``ModelCallRecorded`` events to Kafka and applies backpressure.

``send`` returns only after the broker acked the record (``eventbus.Producer.send`` is durable, acks=all). A
failure or timeout becomes ``RecordUnavailable`` (a 503 with retry-after for the harness); when more than
``max_pending`` records wait for acks, new calls are refused at admission with the same error, so a slow broker
slows harnesses down instead of losing training data.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

import structlog

from contracts import MODEL_CALLS, ModelCallRecorded, encode
from gateway.errors import RecordUnavailable
from gateway.metrics import GatewayMetrics

__all__ = ["EventSink", "Recorder"]

log = structlog.get_logger()


class EventSink(Protocol):
    """What the recorder needs of ``eventbus.Producer``."""

    async def send(self, topic: Any, event: Any) -> Any: ...


class Recorder:
    def __init__(
        self,
        sink: EventSink,
        *,
        topic_name: str,
        metrics: GatewayMetrics,
        max_pending: int,
        timeout_s: float,
        retry_after_s: float,
    ) -> None:
        self._sink = sink
        self.topic = MODEL_CALLS.with_name(topic_name)
        self._metrics = metrics
        self._max_pending = max_pending
        self._timeout_s = timeout_s
        self._retry_after_s = retry_after_s
        self.pending = 0
        # Read when scraped, not set twice per call: every metric update on the hot path is paid again on each call,
        # and a call that follows an idle engine wait runs cold (docs/scaling.md, what waking up costs).
        metrics.records_pending.set_function(lambda: self.pending)

    def admit(self) -> None:
        if self.pending >= self._max_pending:
            raise RecordUnavailable(
                f"{self.pending} records wait for Kafka; retry later", retry_after=self._retry_after_s
            )

    async def send(self, record: ModelCallRecorded) -> None:
        self.pending += 1
        try:
            # asyncio.timeout, not wait_for: on 3.11 wait_for wraps the send in a task of its own, two more turns of
            # the event loop on every call; the timeout and its cancellation of the send are the same.
            async with asyncio.timeout(self._timeout_s):
                delivery = await self._sink.send(self.topic, record)
        except Exception as exc:  # the boundary: whatever the producer raised, the record is not durable
            self._metrics.record_failures.inc()
            log.error("record_failed", session_id=record.session_id, turn=record.call_index, error=repr(exc))
            raise RecordUnavailable(
                "the call could not be recorded durably; retry", retry_after=self._retry_after_s
            ) from exc
        finally:
            self.pending -= 1
        # eventbus.Producer reports the bytes it produced; encoding a long record again only to count it cost as
        # much as the first encoding. Other sinks (tests, benches) may return nothing: count those here.
        size = getattr(delivery, "size", None)
        self._metrics.record_bytes.inc(size if isinstance(size, int) and size > 0 else len(encode(record)))
