"""A gateway node's session service: Kafka in, sessions run, Kafka out.

- ``SESSIONS_REQUESTED`` is consumed by every node in ONE consumer group (``group_id``), so adding a node adds
  capacity. A request is *accepted* by publishing its REQUESTED state (acked by the broker) and only then is its
  offset committed; the session then runs in the background.
- ``SESSIONS_CANCEL`` is read whole by every node (a fresh group per node start, from the earliest offset; cancels
  older than ``cancel_horizon_s`` before start are ignored). A cancel for a session this node runs cancels it at any
  stage; a cancel that arrives before its request is remembered, and the request then ends CANCELLED at once.
- States go to ``SESSIONS_STATE`` and results to ``SESSIONS_FINISHED``, keyed by session id.

Duplicate guarantee: a session id is started at most once per node process (an LRU of the ``seen_sessions_max``
most recent ids), whatever the broker redelivers. Across processes, a request is redelivered only if its offset was
not committed, i.e. the node died (or lost its partition) in the few milliseconds between the REQUESTED ack and the
commit; then a second node runs it again from scratch, with a second REQUESTED (seq 0, another ``node_id``).
Consumers must therefore key on ``session_id`` and keep the first terminal ``SessionFinished`` (the scorer and
rollout do). A node that dies after the commit leaves its sessions without a terminal state; the rollout's group
deadline cancels and replaces them. Nothing is ever started twice concurrently by one node.

Backpressure: the node stops fetching requests while ``max_accepted`` sessions are in flight, leaving the rest to
other nodes. A full node can stay away longer than ``max.poll.interval.ms``: the group then drops it, and it
rejoins when it fetches again (the consumer logs that notice; it is not an error). A request it had fetched before
it was dropped is still accepted, but its commit then fails (the member is gone): that is logged, not fatal, and the
request may come again — to this node, which has seen the id, or to another, which runs it (the redelivery case of
the duplicate guarantee above). A node cut off the network meets the same after the cut, with the group coordinator
not yet found again (_WAIT_COORD): a retriable commit error is tried again for ``COMMIT_RETRY_S`` and then logged,
never fatal (``commit_accepted``).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import structlog

from contracts import (
    SESSIONS_CANCEL,
    SESSIONS_FINISHED,
    SESSIONS_REQUESTED,
    SESSIONS_STATE,
    SessionCancelRequested,
    SessionFinished,
    SessionRequested,
    SessionState,
    SessionStateChanged,
    Topic,
    now_ms,
    valid_id,
)
from eventbus import Consumer, EventBusError, KafkaSettings, Producer, ensure_topics
from floe_tasks import Task
from sessions.metrics import SessionMetrics
from sessions.ready_pool import PriorityGate, ReadyPool
from sessions.runner import EventSink, SessionGateway, SessionRunner
from sessions.settings import SessionSettings
from sessions.states import Lifecycle
from sessions.workspace import (
    PreparedWorkspace,
    TaskResolver,
    WorkspaceError,
    prepare_workspace,
    remove_tree,
)

__all__ = ["KafkaSink", "NodeTopics", "SessionNode", "commit_accepted"]

# Commit errors that mean "this consumer is no longer the group member that fetched the message": the partition
# moved on without us, the message will be delivered again, and the node carries on (it rejoins on its next fetch).
_LOST_MEMBERSHIP = {"UNKNOWN_MEMBER_ID", "ILLEGAL_GENERATION", "REBALANCE_IN_PROGRESS", "_MAX_POLL_EXCEEDED"}

# A retriable commit error (the coordinator is being looked up again after a network cut: _WAIT_COORD, a timeout) is
# tried again for about this long; after that the request may be redelivered, which the duplicate guarantee covers.
COMMIT_RETRY_S = 10.0

log = structlog.get_logger()


async def commit_accepted(consumer: Any, msg: Any, *, retry_s: float = COMMIT_RETRY_S) -> bool:
    """Commit an accepted request's offset; False when it could not be (logged): the request may come again.

    Only a non-retriable error other than lost membership raises: that is a bug or a misconfiguration, not weather.
    """
    deadline = time.monotonic() + retry_s
    delay = 0.2
    while True:
        try:
            await consumer.commit(msg)
            return True
        except EventBusError as exc:
            if exc.code in _LOST_MEMBERSHIP:
                why = "request accepted after the group dropped this node; its commit failed and it may be redelivered"
            elif not exc.retriable:
                raise
            elif time.monotonic() + delay < deadline:
                log.info("offset commit failed, trying again", code=exc.code, retry_in_s=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            else:
                why = "request accepted but its commit kept failing; it may be redelivered"
            log.warning(why, session_id=msg.event.session_id, code=exc.code, error=str(exc))
            return False


@dataclass(frozen=True)
class NodeTopics:
    requested: Topic[SessionRequested] = SESSIONS_REQUESTED
    cancel: Topic[SessionCancelRequested] = SESSIONS_CANCEL
    state: Topic[SessionStateChanged] = SESSIONS_STATE
    finished: Topic[SessionFinished] = SESSIONS_FINISHED


class KafkaSink:
    def __init__(self, producer: Producer, topics: NodeTopics) -> None:
        self.producer = producer
        self.topics = topics

    async def state(self, event: SessionStateChanged) -> None:
        await self.producer.send(self.topics.state, event)

    async def finished(self, event: SessionFinished) -> None:
        await self.producer.send(self.topics.finished, event)


@dataclass
class _Active:
    lifecycle: Lifecycle
    task: asyncio.Task[SessionFinished]
    cancel_reason: list[str] = field(default_factory=list)


class SessionNode:
    """Consume session requests and cancels, run sessions, publish their lifecycle. ``await node.run()``."""

    def __init__(
        self,
        settings: SessionSettings,
        kafka: KafkaSettings,
        gateway: SessionGateway,
        *,
        topics: NodeTopics | None = None,
        group_id: str = "floe-gateway-sessions",
        max_accepted: int | None = None,
        cancel_horizon_s: float = 300.0,
        metrics: SessionMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.kafka = kafka
        self.gateway = gateway
        self.topics = topics or NodeTopics()
        self.group_id = group_id
        self.max_accepted = max_accepted or (2 * settings.max_running + settings.max_preparing)
        self.cancel_horizon_s = cancel_horizon_s
        self.metrics = metrics or SessionMetrics()
        self.tasks = TaskResolver()
        self.prepare_gate = PriorityGate(settings.max_preparing)
        self.run_gate = PriorityGate(settings.max_running)
        self.pool = ReadyPool(settings, self._prepare, self.metrics, self.prepare_gate)
        self.active: dict[str, _Active] = {}
        self.finished: OrderedDict[str, SessionFinished] = OrderedDict()  # recent results (CLI, tests)
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._early_cancels: OrderedDict[str, str] = OrderedDict()
        self._capacity = asyncio.Event()
        self._capacity.set()
        self.started = asyncio.Event()  # both consumers subscribed
        self._runner: SessionRunner | None = None
        self._started_ms = now_ms()

    async def _prepare(self, key: str, task: Task) -> PreparedWorkspace:
        return await prepare_workspace(self.settings, key, task)

    # ------------------------------------------------------------------------------------------------ main

    async def run(self) -> None:
        t = self.topics
        await ensure_topics(self.kafka, [t.requested, t.cancel, t.state, t.finished])
        async with Producer(self.kafka) as producer:
            self.start_local(KafkaSink(producer, self.topics))
            cancel_group = f"{self.group_id}.cancel.{self.settings.node_id}.{secrets.token_hex(4)}"
            try:
                async with (
                    Consumer(self.kafka, [t.requested], group_id=self.group_id) as requests,
                    Consumer(self.kafka, [t.cancel], group_id=cancel_group) as cancels,
                ):
                    self.started.set()
                    await asyncio.gather(self._consume_requests(requests), self._consume_cancels(cancels))
            finally:
                await self.shutdown()

    def start_local(self, sink: EventSink) -> None:
        """Build the runner around ``sink`` without consuming Kafka (``run()`` does this with a Kafka sink; the
        ``floe session run`` CLI and unit tests call it directly and ``submit()`` requests)."""
        self.settings.work_root.mkdir(parents=True, exist_ok=True)
        self.settings.work_root.chmod(0o711)
        # Directories left by a node that died (its sandboxes died with it: --die-with-parent). One node per
        # work_root, so nothing here belongs to a live session.
        for sub in ("sessions", "ws"):
            for stale in (self.settings.work_root / sub).glob("*"):
                log.warning("removing stale session directory", path=str(stale))
                remove_tree(stale)
        self._runner = SessionRunner(
            self.settings,
            gateway=self.gateway,
            sink=sink,
            pool=self.pool,
            run_gate=self.run_gate,
            tasks=self.tasks,
            metrics=self.metrics,
        )
        self._warm_configured()

    def _warm_configured(self) -> None:
        for entry in self.settings.pool_warm_tasks:
            source, _, task_id = entry.rpartition(":")
            try:
                self.pool.warm(entry, self.tasks.resolve(source or "bundled", task_id))
            except WorkspaceError as exc:
                log.warning("warm task unknown", task=entry, error=str(exc))

    async def shutdown(self) -> None:
        """Stop every session (each ends FAILED 'node shutting down' and cleans up) and empty the pool."""
        for active in list(self.active.values()):
            active.task.cancel()
        await asyncio.gather(*(a.task for a in self.active.values()), return_exceptions=True)
        await self.pool.close()

    # ------------------------------------------------------------------------------------------- requests

    async def _consume_requests(self, consumer: Consumer[SessionRequested]) -> None:
        while True:
            await self._capacity.wait()
            msg = await consumer.next(timeout_s=None)
            if msg is None:
                return
            await self.submit(msg.event)
            await commit_accepted(consumer, msg)

    async def submit(self, request: SessionRequested) -> bool:
        """Accept one request (publish REQUESTED) and start it; False for a duplicate. Also used by the CLI."""
        assert self._runner is not None, "submit() before run()"
        sid = request.session_id
        if sid in self._seen or sid in self.active:
            self.metrics.duplicates.inc()
            log.info("duplicate session request ignored", session_id=sid)
            return False
        self._remember(self._seen, sid, None)
        lifecycle = await self._runner.accept(request)
        early = self._early_cancels.pop(sid, None)
        bad_id = None if valid_id(sid) and valid_id(request.group_id) else "invalid session_id or group_id"
        if early is not None or bad_id is not None:
            await self._end_now(lifecycle, SessionState.CANCELLED if early else SessionState.FAILED, early or bad_id)
            return True
        cancel_reason: list[str] = []
        task = asyncio.create_task(self._runner.run(lifecycle, cancel_reason), name=f"session-{sid}")
        self.active[sid] = _Active(lifecycle=lifecycle, task=task, cancel_reason=cancel_reason)
        task.add_done_callback(lambda t: self._done(sid, t))
        if len(self.active) >= self.max_accepted:
            self._capacity.clear()
        return True

    async def _end_now(self, lifecycle: Lifecycle, state: SessionState, reason: str | None) -> None:
        assert self._runner is not None
        request = lifecycle.request
        await self._runner.sink.state(lifecycle.to(state, reason))
        finished = SessionFinished(
            session_id=request.session_id,
            group_id=request.group_id,
            task_id=request.task_id,
            task_source=request.task_source,
            harness=request.harness,
            node_id=self.settings.node_id,
            status=state,
            reason=reason,
        )
        await self._runner.sink.finished(finished)
        self._remember(self.finished, request.session_id, finished)

    def _done(self, sid: str, task: asyncio.Task[SessionFinished]) -> None:
        self.active.pop(sid, None)
        if not task.cancelled() and task.exception() is None:
            self._remember(self.finished, sid, task.result())
        if len(self.active) < self.max_accepted:
            self._capacity.set()

    def _remember(self, store: OrderedDict[str, Any], key: str, value: Any) -> None:
        store[key] = value
        store.move_to_end(key)
        while len(store) > self.settings.seen_sessions_max:
            store.popitem(last=False)

    # -------------------------------------------------------------------------------------------- cancels

    async def _consume_cancels(self, consumer: Consumer[SessionCancelRequested]) -> None:
        horizon = self._started_ms - int(self.cancel_horizon_s * 1000)
        while True:
            msg = await consumer.next(timeout_s=None)
            if msg is None:
                return
            if msg.event.requested_at >= horizon:
                self.cancel(msg.event.session_id, msg.event.reason)

    def cancel(self, session_id: str, reason: str) -> bool:
        """Cancel a session at whatever stage it is; True if it was running here."""
        active = self.active.get(session_id)
        if active is None:
            if session_id not in self._seen:
                self._remember(self._early_cancels, session_id, reason)
            return False
        if not active.cancel_reason:
            active.cancel_reason.append(reason or "cancelled")
            active.task.cancel()
            log.info("session cancel requested", session_id=session_id, reason=reason)
        return True

    async def wait_finished(self, session_id: str, timeout: float = 60.0) -> SessionFinished:
        """The result of a session run by this node (tests, CLI)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if session_id in self.finished:
                return self.finished[session_id]
            active = self.active.get(session_id)
            if active is not None:
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(asyncio.shield(active.task), timeout=max(0.0, deadline - time.monotonic()))
            else:
                await asyncio.sleep(0.02)
        raise TimeoutError(f"session {session_id} did not finish within {timeout}s")
