"""The scheduler over the real broker: requests for the bundled task set, pacing by learner version, the group
deadline cancelling a straggler, and the straggler kept masked in its group's batch."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import pytest

from contracts import (
    Event,
    Outcome,
    RewardPublished,
    SessionCancelRequested,
    SessionFinished,
    SessionRequested,
    SessionState,
    TokenizationMode,
    WeightsPublished,
)
from eventbus import Consumer, KafkaSettings, Producer, ensure_topics
from floe_tasks import TaskSet
from rollout.batching import load_batch_table
from rollout.service import RolloutService
from rollout.settings import RolloutSettings, RunSettings

from .simulate import random_ops, simulate_session

pytestmark = pytest.mark.integration


async def _take(c: Consumer[Any], n: int, timeout_s: float) -> list[Any]:
    out: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < n and time.monotonic() < deadline:
        msg = await c.next(timeout_s=0.5)
        if msg is not None:
            out.append(msg.event)
    assert len(out) == n, f"expected {n} events, got {out}"
    return out


def _play(req: SessionRequested, rng: random.Random, status: SessionState = SessionState.DONE) -> list[Event]:
    calls = simulate_session(
        req.session_id, random_ops(rng, 3, out_len=(1, 9), tool_len=(1, 9)), TokenizationMode.EXACT, rng
    )
    reward = float(req.session_id.endswith("0"))
    return [
        *calls,
        SessionFinished(
            session_id=req.session_id,
            group_id=req.group_id,
            task_id=req.task_id,
            harness=req.harness,
            node_id="n",
            status=status,
            calls=len(calls),
        ),
        RewardPublished(
            session_id=req.session_id,
            group_id=req.group_id,
            task_id=req.task_id,
            reward=reward,
            outcome=Outcome.RESOLVED if reward else Outcome.UNRESOLVED,
            resolved=bool(reward),
        ),
    ]


async def test_scheduler_paces_by_learner_version_and_cancels_at_the_group_deadline(
    kafka_settings: KafkaSettings, rollout_settings: RolloutSettings, consumer_group: str
) -> None:
    tasks = TaskSet.bundled().ids()[:2]
    settings = rollout_settings.model_copy(
        update={
            "schedule": True,
            "runs": [RunSettings(name="train", task_ids=tasks, harness="pi", group_size=2)],
            "max_groups_in_flight": 4,
            "max_off_policy_steps": 0,
            "groups_per_step": 1,
            "group_deadline_s": 3.0,
        }
    )
    service = RolloutService(settings, kafka_settings)
    topics = service.topics
    await ensure_topics(kafka_settings, topics.all)  # before anyone subscribes
    stop = asyncio.Event()
    task = asyncio.create_task(service.run(stop))
    rng = random.Random(0)
    try:
        async with (
            Consumer(kafka_settings, [topics.requested], group_id=consumer_group + "-r") as requests,
            Consumer(kafka_settings, [topics.cancel], group_id=consumer_group + "-c") as cancels,
            Consumer(kafka_settings, [topics.batches], group_id=consumer_group + "-b") as batches,
            Producer(kafka_settings) as gateway,
        ):
            first: list[SessionRequested] = await _take(requests, 2, 30)
            assert {r.group_id for r in first} == {"train-000000"} and {r.task_id for r in first} <= set(tasks)
            assert all(r.metadata["group_size"] == "2" and r.policy_version == 0 for r in first)
            assert await requests.next(timeout_s=1.0) is None  # lag bound: step 1 waits for learner version 1
            for req in first:
                for event in _play(req, rng):
                    await gateway.send(topics.for_event(event), event)
            (batch,) = await _take(batches, 1, 30)
            assert sorted(load_batch_table(batch).column("session_id").unique().to_pylist()) == sorted(
                r.session_id for r in first
            )

            await gateway.send(topics.weights, WeightsPublished(version=1, uri="/w/1", step=1))
            second: list[SessionRequested] = await _take(requests, 2, 30)
            assert {r.policy_version for r in second} == {1} and {r.rollout_step for r in second} == {1}
            done, stuck = sorted(second, key=lambda r: r.session_id)
            for event in _play(done, rng):
                await gateway.send(topics.for_event(event), event)
            (cancel,) = await _take(cancels, 1, 30)
            assert isinstance(cancel, SessionCancelRequested)
            assert cancel.session_id == stuck.session_id and cancel.reason == "group_deadline"
            # The gateway ends the cancelled session; the group is published with the straggler masked, not dropped.
            for event in _play(stuck, rng, status=SessionState.CANCELLED)[:-1]:
                await gateway.send(topics.for_event(event), event)
            (batch2,) = await _take(batches, 1, 30)
            rows = load_batch_table(batch2).to_pylist()
            masked = {r["session_id"] for r in rows if r["masked_reason"]}
            assert masked == {stuck.session_id} and {r["status"] for r in rows} == {"DONE", "CANCELLED"}
            assert batch2.step == 1
            snap = service.snapshot()
            assert snap["scheduler"]["counters"]["cancelled_group_deadline"] == 1
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
