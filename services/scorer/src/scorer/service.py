"""The scorer service: ``SessionFinished`` in, ``RewardPublished`` out, exactly once per session.

Delivery semantics, in two layers:

1. **Transactions** (``eventbus.TransactionalProcessor``): the rewards of a batch and the input offsets commit in
   one Kafka transaction, so a crash, restart or rebalance never yields a second (or a lost) reward for a message.
2. **Idempotent dedupe by ``session_id``**: a ``SessionFinished`` that is *published* twice (a gateway retry) is
   two messages, which transactions do not merge. The service remembers the session ids it has rewarded (bounded
   LRU, ``dedupe_capacity``) and skips repeats, inside a batch and across batches. Sessions are keyed by
   ``session_id``, so repeats land on the same partition and hence the same scorer instance.
   On start the memory is rebuilt from the rewards topic itself (``replay`` of the last ``dedupe_window_s``,
   read_committed), so a duplicate published after a restart is not graded again either.

Grading runs in worker threads (``workers`` concurrent sandboxes); each job has the per-instance wall-clock
timeout from settings. Sessions that ended in FAILED or CANCELLED are not graded: they get an ``error`` reward
(masked), because the fault is not the diff's. Agent timeouts are graded (a trainable negative, or a success).
Tasks that failed gold validation (cached by task-set digest) also get ``error``.
"""

from __future__ import annotations

import asyncio
import collections
import functools
from collections.abc import Sequence
from typing import Any

import structlog

from contracts import (
    REWARDS,
    SESSIONS_FINISHED,
    Outcome,
    RewardPublished,
    SessionFinished,
    SessionState,
    Topic,
    now_ms,
)
from eventbus import KafkaSettings, TransactionalProcessor, ensure_topics
from eventbus.replay import Position, replay
from floe_tasks import TaskError, TaskSet
from scorer.evaluators import GradeResult
from scorer.factory import load_taskset
from scorer.grader import Grader

__all__ = ["ScorerService", "reward_for"]

log = structlog.get_logger()


def reward_for(event: SessionFinished, result: GradeResult, evaluator: str) -> RewardPublished:
    reason = result.reason
    if result.isolation:
        reason = f"{reason} [isolation {result.isolation}]"
    return RewardPublished(
        session_id=event.session_id,
        group_id=event.group_id,
        task_id=event.task_id,
        evaluator=evaluator,
        reward=result.reward,
        outcome=result.outcome,
        resolved=result.resolved,
        tests=result.tests,
        apply_status=result.apply_status,
        reason=reason,
        timings_ms=result.timings_ms,
    )


class _Seen:
    def __init__(self, capacity: int) -> None:
        self._ids: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._capacity = capacity

    def __contains__(self, key: str) -> bool:
        return key in self._ids

    def clear(self) -> None:
        self._ids.clear()

    def add(self, key: str) -> None:
        self._ids[key] = None
        self._ids.move_to_end(key)
        while len(self._ids) > self._capacity:
            self._ids.popitem(last=False)


class ScorerService:
    def __init__(
        self,
        grader: Grader,
        kafka: KafkaSettings,
        *,
        workers: int,
        group_id: str = "scorer",
        transactional_id: str = "scorer-0",
        inputs: Topic[SessionFinished] = SESSIONS_FINISHED,
        outputs: Topic[RewardPublished] = REWARDS,
        invalid_tasks: dict[str, set[str]] | None = None,
        dedupe_capacity: int = 200_000,
        dedupe_window_s: float = 24 * 3600.0,
    ) -> None:
        self.dedupe_window_s = dedupe_window_s
        self.grader = grader
        self.kafka = kafka
        self.workers = workers
        self.group_id = group_id
        self.transactional_id = transactional_id
        self.inputs = inputs
        self.outputs = outputs
        self.invalid_tasks = invalid_tasks or {}
        self._seen = _Seen(dedupe_capacity)
        self._sem = asyncio.Semaphore(workers)
        self.scored = 0
        self._stop = asyncio.Event()

    @functools.cache  # noqa: B019 - one service per process; task sets are immutable
    def _taskset(self, source: str) -> TaskSet:
        return load_taskset(source)

    async def _score(self, event: SessionFinished) -> RewardPublished:
        structlog.contextvars.bind_contextvars(session_id=event.session_id)
        try:
            if event.status in (SessionState.FAILED, SessionState.CANCELLED):
                why = f"session {event.status.value.lower()}: {event.reason or 'no reason given'}"
                return RewardPublished(
                    session_id=event.session_id,
                    group_id=event.group_id,
                    task_id=event.task_id,
                    reward=0.0,
                    outcome=Outcome.ERROR,
                    resolved=False,
                    reason=why,
                )
            try:
                taskset = await asyncio.to_thread(self._taskset, event.task_source)
                task = taskset.get(event.task_id)
            except TaskError as exc:
                return RewardPublished(
                    session_id=event.session_id,
                    group_id=event.group_id,
                    task_id=event.task_id,
                    reward=0.0,
                    outcome=Outcome.ERROR,
                    resolved=False,
                    reason=f"task error: {exc}",
                )
            if task.instance_id in self.invalid_tasks.get(event.task_source, set()):
                return RewardPublished(
                    session_id=event.session_id,
                    group_id=event.group_id,
                    task_id=event.task_id,
                    evaluator=task.evaluator,
                    reward=0.0,
                    outcome=Outcome.ERROR,
                    resolved=False,
                    reason="task failed gold validation",
                )
            async with self._sem:
                result = await asyncio.to_thread(self.grader.grade, task, event.diff)
            log.info(
                "session scored",
                task_id=event.task_id,
                outcome=result.outcome.value,
                reason=result.reason,
                ms=result.timings_ms.get("total"),
            )
            return reward_for(event, result, task.evaluator)
        finally:
            structlog.contextvars.unbind_contextvars("session_id")

    async def handle_batch(self, events: Sequence[SessionFinished]) -> list[RewardPublished]:
        """Rewards for the not-yet-seen sessions of a batch, graded concurrently, in input order."""
        fresh: list[SessionFinished] = []
        batch_ids: set[str] = set()
        for ev in events:
            if ev.session_id in self._seen or ev.session_id in batch_ids:
                log.info("duplicate session skipped", session_id=ev.session_id)
                continue
            batch_ids.add(ev.session_id)
            fresh.append(ev)
        return list(await asyncio.gather(*(self._score(ev) for ev in fresh)))

    def _before_commit(self, rewards: list[RewardPublished]) -> None:
        """Test seam: runs between producing a batch's rewards and committing its transaction."""

    def stop(self) -> None:
        self._stop.set()

    def _load_seen(self) -> int:
        """The dedupe memory, anew: session ids already rewarded (committed) within the dedupe window, from the
        rewards topic."""
        self._seen.clear()
        since = Position(timestamp_ms=now_ms() - int(self.dedupe_window_s * 1000))
        count = 0
        for record in replay(self.kafka, self.outputs, start=since, idle_timeout_s=2.0):
            if isinstance(record.event, RewardPublished):
                self._seen.add(record.event.session_id)
                count += 1
        return count

    async def run(self, *, idle_timeout_s: float | None = None) -> None:
        await ensure_topics(self.kafka, [self.inputs, self.outputs])
        known = await asyncio.to_thread(self._load_seen)
        log.info("dedupe memory rebuilt", topic=self.outputs.name, rewards=known)
        txn_timeout = min(900.0, max(60.0, self.grader.limits.wall_s * 2 + 30))
        overrides: dict[str, Any] = {"max.poll.interval.ms": int(max(300.0, txn_timeout * 2) * 1000)}
        async with TransactionalProcessor(
            self.kafka,
            [self.inputs],
            group_id=self.group_id,
            transactional_id=self.transactional_id,
            outputs=[self.outputs],
            max_batch=max(1, self.workers * 2),
            transaction_timeout_s=txn_timeout,
            consumer_overrides=overrides,
            # As in the rollout: static membership turns a session timeout during a broker restart into a fatal
            # "static consumer fenced" error; a dynamic member rejoins (a restart costs up to one session timeout,
            # 10 s). Zombies are still fenced by the transactional id and the group generation.
            static_membership=False,
        ) as tp:
            log.info("scorer consuming", topic=self.inputs.name, workers=self.workers)
            seals = tp.seals
            async for batch in tp.batches(timeout_s=idle_timeout_s):
                if tp.seals != seals:
                    # A seal aborted what a hung producer left open, rewards this memory counted as committed among
                    # them: their sessions come again from the committed offsets and must be scored again.
                    seals = tp.seals
                    known = await asyncio.to_thread(self._load_seen)
                    log.info("dedupe memory rebuilt after a seal", topic=self.outputs.name, rewards=known)
                rewards = await self.handle_batch([m.event for m in batch])
                for reward in rewards:
                    tp.produce(self.outputs, reward)
                self._before_commit(rewards)
                if await tp.commit(batch):
                    for reward in rewards:
                        self._seen.add(reward.session_id)
                    self.scored += len(rewards)
                else:
                    log.warning("transaction aborted; batch will be redelivered", size=len(batch))
                if self._stop.is_set():
                    break
