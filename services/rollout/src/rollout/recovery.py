"""Retrying a stage's rebuild from the topics while the broker cannot be reached.

A shard rebuilds on every change of its assignment, and a broker outage ends with one: the consumer's session times
out, its partitions are revoked, and the rebuild that follows reads topics whose broker is still away. Crash-only
would restart the process only to meet the same outage; a retriable Kafka error (``EventBusError.retriable``:
broker unavailable, a timeout) is instead retried here with a capped backoff until the broker answers or the service
stops. A rebuild starts from empty state, so a retry never sees half of an earlier attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import structlog

from eventbus.errors import EventBusError

__all__ = ["REBUILD_IDLE_S", "Stopped", "retry_rebuild"]

log = structlog.get_logger()

# A rebuild stops reading a topic after this long without a message or progress: an open transaction of another
# producer holds the topic's stable end back, and its messages come through the live consumer anyway. A topic that no
# live consumer brings (the batches for the leader, the groups for a shard) is read with ``require_end`` instead:
# the rebuild is retried until the read reaches the log's end.
REBUILD_IDLE_S = 1.0
FIRST_DELAY_S = 0.5
MAX_DELAY_S = 5.0


class Stopped(Exception):
    """The service stopped while a rebuild was waiting for the broker: the stage's state is partial, so its loop
    must end without handling or committing anything more."""


async def retry_rebuild(attempt: Callable[[], Awaitable[None]], stop: asyncio.Event, stage: str) -> None:
    """Run ``attempt`` until it succeeds; ``Stopped`` if ``stop`` is set first. Errors that are not retriable
    propagate."""
    delay = FIRST_DELAY_S
    failures = 0
    while True:
        try:
            await attempt()
        except EventBusError as exc:
            if not exc.retriable:
                raise
            if stop.is_set():
                raise Stopped from exc
            failures += 1
            log.warning("rebuild from the topics failed; retrying", stage=stage, error=str(exc), retry_in_s=delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
            if stop.is_set():
                raise Stopped from exc
            delay = min(delay * 2, MAX_DELAY_S)
            continue
        if failures:
            log.info("rebuild from the topics done after retries", stage=stage, failures=failures)
        return
