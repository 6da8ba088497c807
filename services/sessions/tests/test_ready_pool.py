"""The READY pool: hits when warm, spares bounded by look-ahead and caps, priority for waiting sessions."""

from __future__ import annotations

import asyncio
import time

import pytest

from sessions.metrics import SessionMetrics
from sessions.ready_pool import PriorityGate, ReadyPool
from sessions.settings import SessionSettings
from sessions.workspace import TaskResolver, WorkspaceError, prepare_workspace, remove_tree

from .conftest import LocalTaskSet


def make_pool(settings: SessionSettings, **over: object) -> tuple[ReadyPool, list[str]]:
    s = settings.model_copy(update=over)
    prepared: list[str] = []

    async def prepare(key: str, task: object) -> object:
        prepared.append(key)
        return await prepare_workspace(s, key, task)  # type: ignore[arg-type]

    return ReadyPool(s, prepare, SessionMetrics(), PriorityGate(s.max_preparing)), prepared  # type: ignore[arg-type]


async def test_warm_pool_hits_and_refills_to_lookahead(settings: SessionSettings, taskset: LocalTaskSet) -> None:
    pool, prepared = make_pool(settings, pool_lookahead=2, pool_max_per_task=3)
    task = TaskResolver().resolve(str(taskset.jsonl), "demo-1")
    try:
        pool.warm("k", task)
        await pool.wait_idle()
        assert pool.depth("k") == 2 and len(prepared) == 2
        ws, hit = await pool.acquire("k", task)
        assert hit and ws.repo.is_dir()
        await pool.wait_idle()
        assert pool.depth("k") == 2  # refilled to the look-ahead
        remove_tree(ws.root)
        assert pool.metrics.pool_depth._value.get() == 2
    finally:
        await pool.close()
    assert pool.depth() == 0


async def test_cold_without_lookahead_and_caps(settings: SessionSettings, taskset: LocalTaskSet) -> None:
    pool, prepared = make_pool(settings, pool_lookahead=0)
    task = TaskResolver().resolve(str(taskset.jsonl), "demo-1")
    try:
        results = await asyncio.gather(*(pool.acquire("k", task) for _ in range(3)))
        assert [hit for _, hit in results] == [False] * 3 and len(prepared) == 3
        assert len({ws.root for ws, _ in results}) == 3
        await pool.wait_idle()
        assert pool.depth() == 0
        for ws, _ in results:
            remove_tree(ws.root)
    finally:
        await pool.close()


async def test_total_cap_bounds_spares(settings: SessionSettings, taskset: LocalTaskSet) -> None:
    pool, _prepared = make_pool(settings, pool_lookahead=5, pool_max_per_task=5, pool_max_total=1)
    task = TaskResolver().resolve(str(taskset.jsonl), "demo-1")
    try:
        pool.warm("a", task)
        pool.warm("b", task)
        await pool.wait_idle()
        assert pool.depth() == 1
    finally:
        await pool.close()


async def test_prepare_failure_reaches_the_waiting_session(settings: SessionSettings, taskset: LocalTaskSet) -> None:
    pool, _ = make_pool(settings)
    task = TaskResolver().resolve(str(taskset.jsonl), "demo-badprep")
    try:
        with pytest.raises(WorkspaceError, match="exited 3"):
            await pool.acquire("bad", task)
    finally:
        await pool.close()


async def test_priority_gate_admits_highest_first() -> None:
    gate = PriorityGate(1)
    order: list[int] = []
    await gate.acquire(0)

    async def take(priority: int) -> None:
        async with gate.slot(priority):
            order.append(priority)

    waiters = [asyncio.create_task(take(p)) for p in (0, 100, 5, 100)]
    await asyncio.sleep(0.01)
    gate.release()
    await asyncio.gather(*waiters)
    assert order == [100, 100, 5, 0]


async def test_priority_gate_cancelled_waiter_does_not_leak_slot() -> None:
    gate = PriorityGate(1)
    await gate.acquire(0)
    waiter = asyncio.create_task(gate.acquire(0))
    await asyncio.sleep(0.01)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    gate.release()
    started = time.monotonic()
    await asyncio.wait_for(gate.acquire(0), 1)
    assert time.monotonic() - started < 0.5
