"""Stage 2 of the rollout: one leader selects assembled groups, numbers the steps, publishes the batches and
schedules the sessions.

Every rollout instance runs a leader candidate; they share ``floe.rollout.groups`` (one partition) through their own
consumer group, so the member that owns that partition is *the* leader and the others wait. What must be global
lives here and only here: group selection (``rollout.selection``), the step numbers of ``TrajectoryBatch``, and
admission (``rollout.scheduler``: groups in flight and the lag bound hold for the whole deployment).

Exactly once: each batch of ``GroupAssembled`` is one transaction; the ``TrajectoryBatch`` events it completes are
produced in it with the groups' offsets. On taking the partition (and after an aborted transaction) the leader
rebuilds its state from the topics, as the single-instance rollout did:

1. the batches topic to its end: groups already batched are skipped from now on, the next step is one past the last
   batch's, and group selection learns which steps are done. "To its end" is the high watermark, not the stable end
   a read_committed reader stops at: while a leader killed mid-transaction holds its transaction open (up to
   ``transaction_timeout_s``), batches committed after it stay unseen, so the rebuild waits for it to end;
   a rebuild that stopped there would publish those batches again;
2. the groups topic to its end: every group not batched yet goes through selection again (kept ones back to the
   buffer, dropped ones dropped again, and the scheduler hears of the drops before its first tick);
3. a ``Follower`` reads the scheduling inputs (requests, cancels, state changes, ends, weights) from *every*
   partition from the beginning: the scheduler is fed until it has caught up, and then on as they come.

Scheduling output (``SessionRequested``/``SessionCancelRequested``, and the ends of sessions whose node never
answered) goes through an idempotent producer with deterministic ids, so a second leader that briefly overlaps a
fenced one re-publishes the same sessions rather than new ones. A leader that loses the partition stops scheduling
at once (rebalances happen inside its poll, before it schedules again).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import structlog

from contracts import (
    Event,
    GroupAssembled,
    SessionFinished,
    SessionStateChanged,
    TrajectoryBatch,
    WeightsPublished,
)
from eventbus import Follower, KafkaSettings, Producer, TransactionalProcessor
from eventbus.replay import replay_async
from rollout.assembled import from_event
from rollout.batching import BatchEncoder, load_batch_table
from rollout.metrics import RolloutMetrics
from rollout.recovery import REBUILD_IDLE_S, Stopped, retry_rebuild
from rollout.scheduler import RunSpec, Scheduler, SchedulerConfig
from rollout.selection import GroupSelector, PendingBatch
from rollout.settings import RolloutSettings
from rollout.topics import Topics

__all__ = ["Leader"]

log = structlog.get_logger()


class Leader:
    def __init__(
        self,
        settings: RolloutSettings,
        kafka: KafkaSettings,
        topics: Topics,
        metrics: RolloutMetrics,
        specs: list[RunSpec],
        scheduler_config: SchedulerConfig,
        groups_waiting: Callable[[], int] = lambda: 0,
    ) -> None:
        self.settings = settings
        self.kafka = kafka
        self.topics = topics
        self.metrics = metrics
        self.specs = specs
        self.scheduler_config = scheduler_config
        self._groups_waiting = groups_waiting  # this instance's shard: groups still assembling
        self.encoder = BatchEncoder(
            builder=settings.builder,
            inline_max_bytes=settings.inline_max_bytes,
            claim_url=settings.claim_url,
            compression=settings.compression,
        )
        self.decided = asyncio.Event()  # the first assignment is known: leading or not
        self.active = False
        self.terms = 0  # how many times this instance became the leader
        self._follower: Follower | None = None
        self._stop = asyncio.Event()
        self._reset()

    def _reset(self) -> None:
        s = self.settings
        self.scheduler = Scheduler(self.scheduler_config, self.specs) if s.schedule else None
        self.step = 0
        self.selector = GroupSelector(s.group_selection, s.groups_per_batch, s.groups_per_step)
        self._dropped_reported = 0  # dropped groups counted in the batches published so far (their metrics say)
        self.learner_version = 0
        self._batched: set[str] = set()  # groups in a published batch
        self._seen: set[str] = set()  # groups through selection this term

    @property
    def scheduling_inputs(self) -> list[Any]:
        t = self.topics
        return [t.requested, t.cancel, t.state, t.finished, t.weights]

    # ------------------------------------------------------------------------------------------------ running
    async def run(self, stop: asyncio.Event) -> None:
        s = self.settings
        self._stop = stop
        async with (
            TransactionalProcessor(
                self.kafka,
                [self.topics.groups],
                group_id=f"{s.group_id}-leader",
                transactional_id=f"{s.instance_id}-leader",
                outputs=[self.topics.batches],
                max_batch=200,
                static_membership=False,
                transaction_timeout_s=s.transaction_timeout_s,
            ) as tp,
            Producer(self.kafka) as producer,
        ):
            epoch = -1
            try:
                while not stop.is_set():
                    # timeout 0: back after one empty poll (0.2 s), so scheduling runs at least that often.
                    async for batch in tp.batches(timeout_s=0):
                        if tp.assignment_epoch != epoch:
                            epoch = tp.assignment_epoch
                            await self._on_assignment(tp.assignment)
                        for msg in batch:
                            self._add_group(msg.event)
                        produced = self._emit(tp)
                        if produced and s.pause_before_commit_s:
                            await tp.flush()
                            log.warning("paused before commit", batches=[b.batch_id for b in produced])
                            await asyncio.sleep(s.pause_before_commit_s)
                        if await tp.commit(batch):
                            for event in produced:
                                self.metrics.observe_batch(event.arrow_ipc is not None, event.step)
                        else:
                            log.warning("leader transaction aborted; rebuilding state from the topics")
                            epoch = tp.assignment_epoch
                            await self._on_assignment(tp.assignment)
                        await self._follow_and_schedule(producer)
                        if stop.is_set():
                            break
                    if tp.assignment_epoch != epoch:
                        epoch = tp.assignment_epoch
                        await self._on_assignment(tp.assignment)
                    await self._follow_and_schedule(producer)
                    self._update_depths()
            except Stopped:
                log.info("leader stopped while waiting for the broker")
            finally:
                await self._stop_following()

    async def _on_assignment(self, owned: frozenset[tuple[str, int]]) -> None:
        leading = (self.topics.groups.name, 0) in owned
        if leading:
            # A new term (or a rebuild after an abort): everything is re-derived from the topics.
            await self._stop_following()
            self.active = True
            self.terms += 1
            await self._recover()
            log.info("rollout leader", step=self.step, term=self.terms)
        elif self.active:
            log.warning("no longer the rollout leader")
            self.active = False
            await self._stop_following()
            self._reset()
        self.decided.set()

    async def _stop_following(self) -> None:
        follower, self._follower = self._follower, None
        if follower is not None:
            await follower.close()

    async def _recover(self) -> None:
        """Rebuild, retrying while the broker cannot be reached (a lost leadership may be a broker outage's)."""

        async def attempt() -> None:
            await self._stop_following()
            await self._rebuild()

        await retry_rebuild(attempt, self._stop, "leader")

    async def _rebuild(self) -> None:
        self._reset()
        t0 = time.monotonic()
        batches = groups = events = skipped = 0
        # To its end, whatever it takes (retried while an open transaction holds it back): a batch committed behind
        # a dead leader's open transaction reaches this leader by no other way, and one it did not see would be
        # published again, under a step number used twice.
        batches_topic = replay_async(self.kafka, self.topics.batches, idle_timeout_s=REBUILD_IDLE_S, require_end=True)
        async for record in batches_topic:
            event = record.event
            if event is None:
                skipped += 1
                continue
            assert isinstance(event, TrajectoryBatch)
            table = load_batch_table(event).select(["group_id"])
            self._batched.update(table.column("group_id").to_pylist())
            if "rollout_step" in event.metrics:
                self.selector.mark_step_done(int(event.metrics["rollout_step"]))
            if event.step + 1 >= self.step:
                self._dropped_reported = int(event.metrics.get("groups.dropped_zero_signal_total", 0))
            self.step = max(self.step, event.step + 1)
            batches += 1
        async for record in replay_async(self.kafka, self.topics.groups, idle_timeout_s=REBUILD_IDLE_S):
            if record.event is None:
                skipped += 1
                continue
            self._add_group(record.event)
            groups += 1
        # The scheduler's inputs, from every partition: fed until caught up here, then on in _follow_and_schedule.
        self._follower = Follower(self.kafka, self.scheduling_inputs, idle_timeout_s=REBUILD_IDLE_S)
        await self._follower.start()
        while not self._follower.caught_up:
            for rec in await self._follower.poll(2000, 0.2):
                if rec.event is None:
                    skipped += 1
                    continue
                self._observe(rec.event)
                events += 1
        if skipped:
            log.warning("undecodable messages skipped while rebuilding", count=skipped)
        self._update_depths()
        log.info(
            "leader state rebuilt from topics",
            batches=batches,
            groups=groups,
            events=events,
            step=self.step,
            seconds=round(time.monotonic() - t0, 3),
        )

    def _observe(self, event: Event) -> None:
        if isinstance(event, WeightsPublished):
            self.learner_version = max(self.learner_version, event.version)
        if isinstance(event, SessionStateChanged | SessionFinished):
            self.metrics.observe_session(event)
        if self.scheduler is not None:
            self.scheduler.observe(event)

    async def _follow_and_schedule(self, producer: Producer) -> None:
        if not self.active or self._follower is None:
            return
        while records := await self._follower.poll(2000, 0.0):
            for rec in records:
                if rec.event is not None:
                    self._observe(rec.event)
            if len(records) < 2000:
                break
        if self.scheduler is None:
            return
        for event in self.scheduler.tick(int(time.time() * 1000)):
            # Requests, cancels, and the ends of cancelled sessions whose node never answered (see the scheduler).
            await producer.send(self.topics.for_event(event), event)

    # ------------------------------------------------------------------------------------------------ groups
    def _add_group(self, event: Event) -> None:
        """One assembled group: eval groups are measured, train groups go through selection (once per term)."""
        if not isinstance(event, GroupAssembled) or not self.active:
            return
        if event.group_id in self._batched or event.group_id in self._seen:
            return
        self._seen.add(event.group_id)
        group = from_event(event)
        if group.kind == "eval":
            # Eval groups measure the policy; they never become training data.
            self.metrics.observe_eval(group)
            return
        selection = self.selector.add(group)
        self.metrics.observe_group(group, emitted=selection.kept)
        if not selection.kept:
            log.info("zero-signal group dropped", group_id=group.group_id, trainable=group.trainable_sessions)
        if self.scheduler is not None:
            if selection.refill is not None:
                self.scheduler.group_dropped(selection.refill)
            if selection.skipped_step is not None:
                self.scheduler.step_skipped(selection.skipped_step)
        if selection.skipped_step is not None:
            log.warning("every group of a step was dropped: no batch for it", rollout_step=selection.skipped_step)
        self.metrics.set_selection(len(self.selector.dropped), len(self.selector.skipped_steps))

    def _emit(self, tp: TransactionalProcessor[Any]) -> list[TrajectoryBatch]:
        self.metrics.learner_version = self.learner_version
        produced: list[TrajectoryBatch] = []
        if not self.active:
            return produced
        for pending in self.selector.take_batches():
            batch = self.encoder.encode(pending.groups, step=self.step, extra_metrics=self._batch_metrics(pending))
            tp.produce(self.topics.batches, batch)
            log.info(
                "batch produced",
                batch_id=batch.batch_id,
                step=batch.step,
                rows=batch.num_rows,
                groups=batch.num_groups,
                inline=batch.arrow_ipc is not None,
            )
            self._batched.update(g.group_id for g in pending.groups)
            produced.append(batch)
            self.step += 1
        self._update_depths()
        return produced

    def _batch_metrics(self, pending: PendingBatch) -> dict[str, float]:
        # Drops since the previous batch, and in all: summed over the batches, the first gives the second. The total
        # is re-derived from the topics after a restart and the previous batch's total is read back from it, so
        # neither counts a drop twice (drops after the last batch show up in the next one, or only in /state).
        total = len(self.selector.dropped)
        out = {
            "learner_version": float(self.learner_version),
            "groups.dropped_zero_signal": float(max(0, total - self._dropped_reported)),
            "groups.dropped_zero_signal_total": float(total),
        }
        self._dropped_reported = total
        if pending.rollout_step is not None:
            out["rollout_step"] = float(pending.rollout_step)
            out["steps.skipped_total"] = float(len(self.selector.skipped_steps))
        return out

    def _update_depths(self) -> None:
        in_flight = len(self.scheduler.groups) if self.scheduler else 0
        self.metrics.set_depths(self._groups_waiting(), in_flight, self.learner_version)

    def snapshot(self) -> dict[str, Any]:
        out: dict[str, Any] = {"active": self.active, "terms": self.terms}
        if not self.active:
            return out
        out["step"] = self.step
        out["groups_buffered"] = self.selector.buffered()
        out["group_selection"] = self.selector.snapshot()
        if self.scheduler is not None:
            out["scheduler"] = self.scheduler.snapshot()
        return out
