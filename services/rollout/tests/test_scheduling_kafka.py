"""The scheduler over the real broker: requests for the bundled task set, pacing by learner version, the group
deadline cancelling a straggler, and the straggler kept masked in its group's batch; group selection (refill
replaces a zero-signal group, drop skips a step that kept none, also after a restart) and periodic eval rounds."""

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
    SessionKind,
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


def _play(
    req: SessionRequested, rng: random.Random, status: SessionState = SessionState.DONE, reward: float | None = None
) -> list[Event]:
    """A session's calls, end and reward; by default the group's first session solves it (the group has signal)."""
    calls = simulate_session(
        req.session_id, random_ops(rng, 3, out_len=(1, 9), tool_len=(1, 9)), TokenizationMode.EXACT, rng
    )
    reward = float(req.session_id.endswith("0")) if reward is None else reward
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


async def _send(gateway: Producer, service: RolloutService, reqs: list[SessionRequested], **play: Any) -> None:
    rng = random.Random(len(reqs))
    for req in reqs:
        for event in _play(req, rng, **play):
            await gateway.send(service.topics.for_event(event), event)


def _by_group(reqs: list[SessionRequested]) -> list[list[SessionRequested]]:
    groups: dict[str, list[SessionRequested]] = {}
    for r in reqs:
        groups.setdefault(r.group_id, []).append(r)
    return [groups[g] for g in sorted(groups)]


async def test_refill_replaces_a_zero_signal_group_and_eval_rounds_follow_the_learner(
    kafka_settings: KafkaSettings, rollout_settings: RolloutSettings, consumer_group: str
) -> None:
    tasks = TaskSet.bundled().ids()
    settings = rollout_settings.model_copy(
        update={
            "schedule": True,
            "runs": [
                RunSettings(name="train", task_ids=tasks[:2], group_size=2),
                RunSettings(
                    name="heldout", kind=SessionKind.EVAL, task_ids=tasks[2:3], group_size=2, every_steps=1, epochs=2
                ),
            ],
            "max_groups_in_flight": 4,
            "max_off_policy_steps": 0,
            "groups_per_step": 2,
            "groups_per_batch": 2,
            "group_selection": "refill",
            "max_steps": 1,
        }
    )
    service = RolloutService(settings, kafka_settings)
    topics = service.topics
    await ensure_topics(kafka_settings, topics.all)
    stop = asyncio.Event()
    task = asyncio.create_task(service.run(stop))
    try:
        async with (
            Consumer(kafka_settings, [topics.requested], group_id=consumer_group + "-r") as requests,
            Consumer(kafka_settings, [topics.batches], group_id=consumer_group + "-b") as batches,
            Producer(kafka_settings) as gateway,
        ):
            first: list[SessionRequested] = await _take(requests, 6, 30)
            evals = [r for r in first if r.kind is SessionKind.EVAL]
            assert len(evals) == 2 and all(r.priority == 100 for r in evals)
            assert {(r.metadata["eval_round"], r.metadata["eval_at_version"]) for r in evals} == {("0", "0")}
            zero, signal = _by_group([r for r in first if r.kind is SessionKind.TRAIN])
            await _send(gateway, service, zero, reward=0.0)  # all wrong: no signal
            await _send(gateway, service, signal)
            await _send(gateway, service, evals)
            # Step 0 still lacks a group with signal; before refill nothing more came (lag 0, version 0): a stall.
            replacement: list[SessionRequested] = await _take(requests, 2, 30)
            assert {(r.kind, r.rollout_step, r.metadata["train_index"]) for r in replacement} == {
                (SessionKind.TRAIN, 0, "2")
            }
            await _send(gateway, service, replacement)
            (batch,) = await _take(batches, 1, 30)
            assert set(load_batch_table(batch).column("group_id").to_pylist()) == {
                signal[0].group_id,
                replacement[0].group_id,
            }
            assert batch.metrics["groups.dropped_zero_signal"] == batch.metrics["groups.dropped_zero_signal_total"] == 1
            assert batch.metrics["groups.zero_signal"] == 0
            assert await requests.next(timeout_s=1.0) is None  # max_steps=1; eval round 1 waits for version 1
            await gateway.send(topics.weights, WeightsPublished(version=1, uri="/w/1", step=1))
            second: list[SessionRequested] = await _take(requests, 2, 30)
            assert {(r.kind, r.metadata["eval_round"], r.metadata["eval_at_version"]) for r in second} == {
                (SessionKind.EVAL, "1", "1")
            }
            await _send(gateway, service, second, reward=1.0)
            deadline = time.monotonic() + 30
            while len(service.snapshot()["eval_rounds"]) < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            snap = service.snapshot()
            assert [(r["round"], r["at_version"], r["sessions"]) for r in snap["eval_rounds"]] == [(0, 0, 2), (1, 1, 2)]
            assert snap["eval_rounds"][1]["solved_fraction"] == 1.0
            assert snap["groups_dropped_zero_signal"] == 1 and snap["scheduler"]["train_groups_dropped"] == 1
            assert snap["scheduler"]["train_done"] is True
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


async def test_drop_skips_a_step_whose_groups_all_had_no_signal_and_a_restart_knows_it(
    kafka_settings: KafkaSettings, rollout_settings: RolloutSettings, consumer_group: str
) -> None:
    settings = rollout_settings.model_copy(
        update={
            "schedule": True,
            "runs": [RunSettings(name="train", task_ids=TaskSet.bundled().ids()[:2], group_size=2)],
            "max_groups_in_flight": 4,
            "max_off_policy_steps": 0,
            "groups_per_step": 2,
            "group_selection": "drop",
            "max_steps": 2,
        }
    )
    service = RolloutService(settings, kafka_settings)
    topics = service.topics
    await ensure_topics(kafka_settings, topics.all)
    stop = asyncio.Event()
    task = asyncio.create_task(service.run(stop))
    try:
        async with (
            Consumer(kafka_settings, [topics.requested], group_id=consumer_group + "-r") as requests,
            Consumer(kafka_settings, [topics.batches], group_id=consumer_group + "-b") as batches,
            Producer(kafka_settings) as gateway,
        ):
            step0: list[SessionRequested] = await _take(requests, 4, 30)
            assert {r.rollout_step for r in step0} == {0}
            await _send(gateway, service, step0, reward=0.0)
            # No batch (and so no version) comes for step 0; step 1 is admitted anyway (lag 0).
            step1: list[SessionRequested] = await _take(requests, 4, 30)
            assert {r.rollout_step for r in step1} == {1}
            zero, signal = _by_group(step1)
            await _send(gateway, service, zero, reward=0.0)
            await _send(gateway, service, signal)
            (batch,) = await _take(batches, 1, 30)
            assert (batch.step, batch.num_groups) == (0, 1)
            assert set(load_batch_table(batch).column("group_id").to_pylist()) == {signal[0].group_id}
            assert batch.metrics["rollout_step"] == 1 and batch.metrics["steps.skipped_total"] == 1
            assert batch.metrics["groups.dropped_zero_signal"] == batch.metrics["groups.dropped_zero_signal_total"] == 3
            assert await requests.next(timeout_s=1.0) is None  # max_steps=2
            snap = service.snapshot()
            assert snap["group_selection"]["steps_skipped"] == [0] and snap["scheduler"]["steps_skipped"] == [0]
            assert snap["groups_dropped_zero_signal"] == 3 and snap["steps_skipped"] == 1
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)

    # A restart rebuilds the same picture from the topics, and neither re-publishes the batch nor admits anything.
    again = RolloutService(settings, kafka_settings)
    stop = asyncio.Event()
    task = asyncio.create_task(again.run(stop))
    try:
        await asyncio.wait_for(again.ready.wait(), 30)
        snap = again.snapshot()
        assert snap["scheduler"]["steps_skipped"] == [0] and snap["scheduler"]["train_done"] is True
        assert snap["group_selection"]["groups_dropped_zero_signal"] == 3 and snap["step"] == 1
        assert snap["groups_buffered"] == 0
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
