"""The READY pool: prepared workspaces waiting ahead of demand, per task, on this node.

Demand drives it. Every session asks ``acquire(key, task)`` when it enters PREPARING; a prepared workspace for
that task is handed over at once (a pool hit), otherwise the session waits for one being prepared (cold). Each
acquisition refills the task's pool: enough preparations are started to cover the sessions waiting, plus
``pool_lookahead`` spares while the task has had demand within ``pool_demand_ttl_s`` (a GRPO group brings G
requests for one task, and the next step often brings the task again), never more than ``pool_max_per_task``
spares per task or ``pool_max_total`` in all. Preparations run under a priority gate shared with cold
preparations: waiting sessions (by their request priority) always go before look-ahead spares.

A preparation whose session was cancelled meanwhile finishes and becomes a spare (within the caps above), since
its siblings usually want the same task. Spares idle for ``pool_idle_ttl_s`` are deleted; ``close()`` deletes
every spare. A workspace handed out belongs to its session, which deletes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import structlog

from floe_tasks import Task
from sessions.metrics import SessionMetrics
from sessions.settings import SessionSettings
from sessions.workspace import PreparedWorkspace, remove_tree

__all__ = ["PriorityGate", "ReadyPool"]

log = structlog.get_logger()

PrepareFn = Callable[[str, Task], Awaitable[PreparedWorkspace]]
LOOKAHEAD_PRIORITY = -1


class PriorityGate:
    """A semaphore that admits the highest priority first, FIFO within one priority."""

    def __init__(self, slots: int) -> None:
        self._free = slots
        self._queue: list[tuple[int, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    @contextlib.asynccontextmanager
    async def slot(self, priority: int) -> AsyncIterator[None]:
        await self.acquire(priority)
        try:
            yield
        finally:
            self.release()

    async def acquire(self, priority: int) -> None:
        if self._free > 0 and not self._queue:
            self._free -= 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._queue, (-priority, next(self._order), fut))
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # granted and cancelled at once: hand the slot on
            else:
                fut.cancel()
            raise

    def release(self) -> None:
        while self._queue:
            _, _, fut = heapq.heappop(self._queue)
            if not fut.done():
                fut.set_result(None)
                return
        self._free += 1

    @property
    def waiting(self) -> int:
        return sum(1 for _, _, f in self._queue if not f.done())


@dataclass
class _TaskPool:
    task: Task
    ready: deque[PreparedWorkspace] = field(default_factory=deque)
    waiters: deque[tuple[int, asyncio.Future[PreparedWorkspace]]] = field(default_factory=deque)
    inflight: int = 0
    last_demand: float = 0.0


class ReadyPool:
    def __init__(
        self, settings: SessionSettings, prepare: PrepareFn, metrics: SessionMetrics, gate: PriorityGate
    ) -> None:
        self.settings = settings
        self._prepare = prepare
        self.metrics = metrics
        self.gate = gate
        self._pools: dict[str, _TaskPool] = {}
        self._jobs: set[asyncio.Task[None]] = set()
        self._closed = False

    # ------------------------------------------------------------------------------------------------ queries

    def depth(self, key: str | None = None) -> int:
        if key is not None:
            pool = self._pools.get(key)
            return len(pool.ready) if pool else 0
        return sum(len(p.ready) for p in self._pools.values())

    def preparing(self, key: str | None = None) -> int:
        if key is not None:
            pool = self._pools.get(key)
            return pool.inflight if pool else 0
        return sum(p.inflight for p in self._pools.values())

    # ------------------------------------------------------------------------------------------------ demand

    async def acquire(self, key: str, task: Task, priority: int = 0) -> tuple[PreparedWorkspace, bool]:
        """A prepared workspace for ``key`` and whether it came from the pool. Raises what preparation raised."""
        pool = self._pool(key, task)
        pool.last_demand = time.monotonic()
        self._evict_idle()
        if pool.ready:
            ws = pool.ready.popleft()
            self.metrics.pool_hits.labels("pool").inc()
            self._refill(key)
            self._gauge()
            return ws, True
        fut: asyncio.Future[PreparedWorkspace] = asyncio.get_running_loop().create_future()
        pool.waiters.append((priority, fut))
        self._refill(key)
        try:
            ws = await fut
        except asyncio.CancelledError:
            with contextlib.suppress(ValueError):
                pool.waiters.remove((priority, fut))
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self._deliver(fut.result())  # prepared for us, but we are gone: a spare for the next session
            raise
        self.metrics.pool_hits.labels("cold").inc()
        return ws, False

    def warm(self, key: str, task: Task) -> None:
        """Mark ``key`` as in demand now (operator warm list, or the node's look-ahead) and fill its spares."""
        self._pool(key, task).last_demand = time.monotonic()
        self._refill(key)

    def _pool(self, key: str, task: Task) -> _TaskPool:
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = _TaskPool(task=task)
        return pool

    def _spare_target(self, pool: _TaskPool) -> int:
        s = self.settings
        recent = time.monotonic() - pool.last_demand < s.pool_demand_ttl_s
        return min(s.pool_lookahead, s.pool_max_per_task) if recent else 0

    def _refill(self, key: str) -> None:
        if self._closed:
            return
        pool = self._pools[key]
        waiting = sum(1 for _, f in pool.waiters if not f.done())
        spares_have = len(pool.ready) + pool.inflight - waiting
        spares_room = self.settings.pool_max_total - (self.depth() + self.preparing() - waiting)
        need_for_waiters = max(0, waiting - pool.inflight)
        need_spares = max(0, min(self._spare_target(pool) - max(spares_have, 0), spares_room))
        priorities = sorted((p for p, f in pool.waiters if not f.done()), reverse=True)
        for i in range(need_for_waiters + need_spares):
            priority = priorities[i] if i < need_for_waiters and i < len(priorities) else LOOKAHEAD_PRIORITY
            pool.inflight += 1  # counted now, not when the job starts: the next _refill must see it
            job = asyncio.create_task(self._prepare_one(key, priority))
            self._jobs.add(job)
            job.add_done_callback(self._jobs.discard)

    async def _prepare_one(self, key: str, priority: int) -> None:
        pool = self._pools[key]
        self._gauge()
        try:
            async with self.gate.slot(priority):
                started = time.monotonic()
                ws = await self._prepare(key, pool.task)
                self.metrics.prepare_seconds.observe(time.monotonic() - started)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("workspace prepare failed", key=key, error=str(exc))
            # The failure belongs to the first session waiting for this task, if any; a spare just fails.
            while pool.waiters:
                _, fut = pool.waiters.popleft()
                if not fut.done():
                    fut.set_exception(exc)
                    break
            return
        finally:
            pool.inflight -= 1
            self._gauge()
        self._deliver(ws)

    def _deliver(self, ws: PreparedWorkspace) -> None:
        pool = self._pools.get(ws.key)
        if pool is not None and not self._closed:
            while pool.waiters:
                _, fut = pool.waiters.popleft()
                if not fut.done():
                    fut.set_result(ws)
                    return
            s = self.settings
            if len(pool.ready) < s.pool_max_per_task and self.depth() < s.pool_max_total:
                ws.prepared_at = time.monotonic()
                pool.ready.append(ws)
                self._gauge()
                return
        remove_tree(ws.root)

    def _evict_idle(self) -> None:
        cutoff = time.monotonic() - self.settings.pool_idle_ttl_s
        for pool in self._pools.values():
            while pool.ready and pool.ready[0].prepared_at < cutoff:
                remove_tree(pool.ready.popleft().root)
        self._gauge()

    def _gauge(self) -> None:
        self.metrics.pool_depth.set(self.depth())
        self.metrics.pool_preparing.set(self.preparing())

    async def wait_idle(self, timeout: float = 60.0) -> None:
        """Wait until no preparation is running (tests, benchmarks, shutdown)."""
        deadline = time.monotonic() + timeout
        while self._jobs and time.monotonic() < deadline:
            await asyncio.wait(set(self._jobs), timeout=max(0.0, deadline - time.monotonic()))

    async def close(self) -> None:
        self._closed = True
        for job in list(self._jobs):
            job.cancel()
        await asyncio.gather(*self._jobs, return_exceptions=True)
        for pool in self._pools.values():
            while pool.ready:
                await asyncio.to_thread(remove_tree, pool.ready.popleft().root)
            for _, fut in pool.waiters:
                fut.cancel()
        self._gauge()
