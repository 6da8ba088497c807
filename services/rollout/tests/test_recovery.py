"""retry_rebuild: a rebuild that meets a broker outage is retried until the broker answers, or ends with Stopped."""

from __future__ import annotations

import asyncio

import pytest

from eventbus.errors import BrokerUnavailable, TopicMissing
from rollout import recovery
from rollout.recovery import Stopped, retry_rebuild


@pytest.fixture(autouse=True)
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recovery, "FIRST_DELAY_S", 0.01)
    monkeypatch.setattr(recovery, "MAX_DELAY_S", 0.02)


async def test_retriable_errors_are_retried_until_the_rebuild_succeeds() -> None:
    calls: list[int] = []

    async def attempt() -> None:
        calls.append(len(calls))
        if len(calls) < 4:
            raise BrokerUnavailable("replay: metadata: Broker transport failure")

    await retry_rebuild(attempt, asyncio.Event(), "shard")
    assert calls == [0, 1, 2, 3]


async def test_an_error_that_is_not_retriable_propagates_at_once() -> None:
    calls = 0

    async def attempt() -> None:
        nonlocal calls
        calls += 1
        raise TopicMissing("topic floe.rollout.groups does not exist")

    with pytest.raises(TopicMissing):
        await retry_rebuild(attempt, asyncio.Event(), "shard")
    assert calls == 1


async def test_a_stop_while_waiting_for_the_broker_ends_with_stopped() -> None:
    stop = asyncio.Event()

    async def attempt() -> None:
        raise BrokerUnavailable("down")

    task = asyncio.create_task(retry_rebuild(attempt, stop, "leader"))
    await asyncio.sleep(0.05)
    assert not task.done(), "it gave up on a broker that may come back"
    stop.set()
    with pytest.raises(Stopped):
        await asyncio.wait_for(task, 1)
