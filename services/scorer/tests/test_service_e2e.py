"""End to end over the real broker: SessionFinished in, RewardPublished out, exactly once per session, even when
events are published twice and when the scorer crashes between producing rewards and committing."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from contracts import (
    REWARDS,
    SESSIONS_FINISHED,
    Outcome,
    RewardPublished,
    SessionFinished,
    SessionState,
    Topic,
)
from eventbus import Consumer, KafkaSettings, Producer
from floe_tasks import TaskSet
from scorer.grader import Grader
from scorer.service import ScorerService

pytestmark = pytest.mark.integration


class Crash(RuntimeError):
    pass


class CrashingOnce(ScorerService):
    """Dies after producing its first batch of rewards, before the transaction commits (a process crash)."""

    def _before_commit(self, rewards: list[RewardPublished]) -> None:
        raise Crash("simulated crash before commit")


def finished(sid: str, task_id: str, diff: str, status: SessionState = SessionState.DONE) -> SessionFinished:
    return SessionFinished(
        session_id=sid,
        group_id="g1",
        task_id=task_id,
        harness="command",
        node_id="n1",
        status=status,
        diff=diff,
        reason="harness crashed" if status is SessionState.FAILED else None,
    )


async def _drain(consumer: Consumer[Any], want: int, quiet_s: float, deadline_s: float) -> list[RewardPublished]:
    got: list[RewardPublished] = []
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    while loop.time() < end:
        msg = await consumer.next(timeout_s=quiet_s if len(got) >= want else 1.0)
        if msg is None and len(got) >= want:
            break  # quiet after the expected count: any duplicate would have arrived by now
        if msg is not None:
            got.append(msg.event)
    return got


async def test_each_session_rewarded_exactly_once(
    kafka_settings: KafkaSettings,
    topic_factory: Callable[..., Topic[Any]],
    consumer_group: str,
    grader: Grader,
) -> None:
    inp = topic_factory(SESSIONS_FINISHED, partitions=2)
    out = topic_factory(REWARDS, partitions=2)
    ts = TaskSet.bundled()
    gold = ts.get("floe__pager-3")
    events = [
        finished("s-gold", gold.instance_id, gold.patch),
        finished("s-empty", gold.instance_id, ""),
        finished("s-garbage", "floe__calx-7", "not a diff\n"),
        finished("s-unknown", "nope__nope-1", gold.patch),
        finished("s-failed", gold.instance_id, gold.patch, SessionState.FAILED),
    ]
    async with Producer(kafka_settings) as producer:
        for ev in [*events, events[0], events[1]]:  # two sessions published twice (gateway retry)
            await producer.send(inp, ev)

    txn_id = f"scorer-{uuid.uuid4().hex[:8]}"
    first = CrashingOnce(
        grader, kafka_settings, workers=2, group_id=consumer_group, transactional_id=txn_id, inputs=inp, outputs=out
    )
    with pytest.raises(Crash):
        await asyncio.wait_for(first.run(), timeout=90)

    second = ScorerService(
        grader, kafka_settings, workers=2, group_id=consumer_group, transactional_id=txn_id, inputs=inp, outputs=out
    )
    runner = asyncio.create_task(second.run())
    try:
        async with Consumer(kafka_settings, [out], group_id=consumer_group + "-rewards") as reader:
            rewards = await _drain(reader, want=len(events), quiet_s=4.0, deadline_s=120)
    finally:
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner

    by_session = {r.session_id: r for r in rewards}
    assert sorted(r.session_id for r in rewards) == sorted(by_session), "a session was rewarded twice"
    assert set(by_session) == {e.session_id for e in events}
    assert by_session["s-gold"].outcome is Outcome.RESOLVED and by_session["s-gold"].reward == 1.0
    assert by_session["s-gold"].tests and by_session["s-gold"].apply_status == "git apply --verbose"
    assert by_session["s-empty"].outcome is Outcome.UNRESOLVED and by_session["s-empty"].reason
    assert by_session["s-garbage"].reason and "did not apply" in by_session["s-garbage"].reason
    assert by_session["s-unknown"].outcome is Outcome.ERROR
    assert by_session["s-failed"].outcome is Outcome.ERROR and "harness crashed" in (
        by_session["s-failed"].reason or ""
    )
    assert second.scored == len(events)

    # A restart with fresh memory: a late duplicate of a rewarded session is not graded again; a new one is.
    async with Producer(kafka_settings) as producer:
        await producer.send(inp, events[0])
        await producer.send(inp, finished("s-new", "floe__calx-7", ""))
    third = ScorerService(
        grader, kafka_settings, workers=2, group_id=consumer_group, transactional_id=txn_id, inputs=inp, outputs=out
    )
    runner = asyncio.create_task(third.run())
    try:
        async with Consumer(kafka_settings, [out], group_id=consumer_group + "-all") as reader:
            everything = await _drain(reader, want=len(events) + 1, quiet_s=4.0, deadline_s=120)
    finally:
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner
    ids = [r.session_id for r in everything]
    assert sorted(ids) == sorted([e.session_id for e in events] + ["s-new"]), "late duplicate was graded again"
    assert third.scored == 1
