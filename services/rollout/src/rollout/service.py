"""The rollout service: schedule sessions, assemble groups, publish trajectory batches exactly once.

Data path (exactly once)::

    sessions.requested, sessions.finished, model-calls, rewards, sessions.state, weights
        └─ TransactionalProcessor ─▶ GroupAssembler ─▶ ready groups ─▶ TrajectoryBatch (+ Parquet, claim checks)

Every input batch is one Kafka transaction: the batches it completes are produced in it, together with the input
offsets. The assembler's state (sessions waiting for their group) spans many transactions, so it is **rebuilt from
the topics** on start and after an aborted transaction (``_recover``), in this order:

1. the transactional producer is initialised first, which fences any previous incarnation with the same
   ``instance_id`` and aborts its open transaction;
2. the output topic is read to its end (``eventbus.replay``, ``read_committed``): every group already published is
   marked emitted, and the next ``step`` is one past the last published batch;
3. the input topics are read to their end into the assembler and the scheduler (duplicates are ignored);
4. the groups complete in that state are taken again (``_take_ready``): kept ones go back to the buffer, dropped ones
   are dropped again, and the scheduler hears of them (``rollout.selection``) before its first tick.

Then the processor resumes from its committed offsets. A ``kill -9`` at any moment therefore neither loses (an
uncommitted batch's inputs are re-delivered, or already in the rebuilt state) nor duplicates (a committed batch's
groups are marked emitted) a batch. Batch ids and bytes are deterministic functions of their groups; the Parquet
dataset is keyed by group id and claim-check files by content, so a rebuilt group overwrites rather than duplicates.

Scheduling output (``SessionRequested``/``SessionCancelRequested``) goes through an ordinary idempotent producer: ids
are deterministic, and a re-published request names the same session.

Limits: one instance per ``instance_id`` (no partition-level sharding of the assembler yet); groups completed only by
a timer (missing calls expired) are published with the next input batch; the rebuild reads everything the topics
retain.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import structlog

from contracts import (
    MODEL_CALLS,
    REWARDS,
    SESSIONS_CANCEL,
    SESSIONS_FINISHED,
    SESSIONS_REQUESTED,
    SESSIONS_STATE,
    TRAJECTORY_BATCHES,
    WEIGHTS,
    Event,
    SessionCancelRequested,
    SessionFinished,
    SessionStateChanged,
    Topic,
    TrajectoryBatch,
    WeightsPublished,
)
from eventbus import KafkaSettings, Producer, TransactionalProcessor, ensure_topics
from eventbus.replay import replay_async
from rollout.batching import BatchEncoder, load_batch_table
from rollout.dataset import write_group
from rollout.groups import GroupAssembler
from rollout.metrics import RolloutMetrics
from rollout.scheduler import RunSpec, Scheduler, SchedulerConfig
from rollout.selection import GroupSelector, PendingBatch
from rollout.settings import RolloutSettings, RunSettings

__all__ = ["RolloutService", "Topics", "run_specs"]

log = structlog.get_logger()

# The rebuild stops reading a topic after this long without a message or progress: an open transaction of another
# producer holds the topic's stable end back, and its messages come through the live consumer anyway.
REBUILD_IDLE_S = 1.0


@dataclass(frozen=True)
class Topics:
    requested: Topic[Any]
    cancel: Topic[Any]
    state: Topic[Any]
    finished: Topic[Any]
    calls: Topic[Any]
    rewards: Topic[Any]
    batches: Topic[Any]
    weights: Topic[Any]

    @staticmethod
    def with_suffix(suffix: str) -> Topics:
        def t(topic: Topic[Any]) -> Topic[Any]:
            return topic.with_name(topic.name + suffix) if suffix else topic

        return Topics(
            t(SESSIONS_REQUESTED),
            t(SESSIONS_CANCEL),
            t(SESSIONS_STATE),
            t(SESSIONS_FINISHED),
            t(MODEL_CALLS),
            t(REWARDS),
            t(TRAJECTORY_BATCHES),
            t(WEIGHTS),
        )

    def for_event(self, event: Event) -> Topic[Any]:
        """The topic an event of this type is published to."""
        for topic in self.all:
            if isinstance(event, topic.model):
                return topic
        raise KeyError(f"no rollout topic carries {type(event).__name__}")

    @property
    def inputs(self) -> list[Topic[Any]]:
        return [self.requested, self.cancel, self.state, self.finished, self.calls, self.rewards, self.weights]

    @property
    def all(self) -> list[Topic[Any]]:
        return [*self.inputs, self.batches]


def run_specs(runs: list[RunSettings]) -> list[RunSpec]:
    """Resolve each run's task ids from its task source (the bundled set or a SWE-bench-format JSONL)."""
    from floe_tasks import TaskSet

    specs = []
    for run in runs:
        tasks = TaskSet.from_source(run.task_source)
        ids = tuple(run.task_ids) if run.task_ids else tuple(tasks.ids())
        missing = [i for i in ids if i not in tasks]
        if missing:
            raise ValueError(f"run {run.name!r}: tasks not in {run.task_source}: {missing[:5]}")
        specs.append(
            RunSpec(
                name=run.name,
                task_ids=ids,
                harness=run.harness,
                kind=run.kind,
                group_size=run.group_size,
                task_source=run.task_source,
                sampling=run.sampling,
                tokenization=run.tokenization,
                model=run.model,
                agent_timeout_s=run.agent_timeout_s,
                session_timeout_s=run.session_timeout_s,
                epochs=run.epochs,
                every_steps=run.every_steps,
                shuffle_seed=run.shuffle_seed,
            )
        )
    return specs


class RolloutService:
    def __init__(self, settings: RolloutSettings, kafka: KafkaSettings, metrics: RolloutMetrics | None = None) -> None:
        self.settings = settings
        self.kafka = kafka
        self.topics = Topics.with_suffix(settings.topic_suffix)
        self.metrics = metrics or RolloutMetrics()
        self.encoder = BatchEncoder(
            builder=settings.builder,
            inline_max_bytes=settings.inline_max_bytes,
            claim_url=settings.claim_url,
            compression=settings.compression,
        )
        self.scheduler_config = SchedulerConfig(
            max_groups_in_flight=settings.max_groups_in_flight,
            max_off_policy_steps=settings.max_off_policy_steps,
            groups_per_step=settings.groups_per_step,
            min_usable_fraction=settings.min_usable_fraction,
            grace_sessions=settings.grace_sessions,
            group_deadline_s=settings.group_deadline_s,
            cancel_grace_s=settings.cancel_grace_s,
            max_steps=settings.max_steps,
        )
        self.specs = run_specs(settings.runs) if settings.schedule else []
        self.ready = asyncio.Event()
        self._reset()

    def _reset(self) -> None:
        s = self.settings
        self.assembler = GroupAssembler(s.builder, s.advantage, s.eot_token_ids)
        self.scheduler = Scheduler(self.scheduler_config, self.specs) if s.schedule else None
        self.step = 0
        self.selector = GroupSelector(s.group_selection, s.groups_per_batch, s.groups_per_step)
        self._dropped_reported = 0  # dropped groups counted in the batches published so far (their metrics say)
        self.learner_version = 0
        self._finished_at: dict[str, float] = {}

    # ------------------------------------------------------------------------------------------------ running
    async def run(self, stop: asyncio.Event) -> None:
        await ensure_topics(self.kafka, self.topics.all)
        s = self.settings
        async with (
            TransactionalProcessor(
                self.kafka,
                self.topics.inputs,
                group_id=s.group_id,
                transactional_id=s.instance_id,
                max_batch=500,
                # Static membership turns a session timeout during a broker restart into a fatal "static consumer
                # fenced" error (seen in tests/e2e); a dynamic member just rejoins. Zombies are still fenced by the
                # transactional id and the group generation sent with the offsets.
                static_membership=False,
            ) as tp,
            Producer(self.kafka) as producer,
        ):
            await self._recover()
            self.ready.set()
            log.info("rollout service ready", step=self.step, groups_waiting=self.assembler.groups_waiting())
            while not stop.is_set():
                await self._schedule(producer)
                async for batch in tp.batches(timeout_s=s.tick_s):
                    for msg in batch:
                        self._observe(msg.event)
                    self._expire_missing_calls()
                    produced = self._emit(tp)
                    if produced and s.pause_before_commit_s:
                        await tp.flush()
                        log.warning("paused before commit", batches=[b.batch_id for b in produced])
                        await asyncio.sleep(s.pause_before_commit_s)
                    if await tp.commit(batch):
                        for event in produced:
                            self.metrics.observe_batch(event.arrow_ipc is not None, event.step)
                    else:
                        log.warning("transaction aborted; rebuilding state from the topics")
                        await self._recover()
                    await self._schedule(producer)
                    if stop.is_set():
                        break
                self._expire_missing_calls()
                self._update_depths()

    async def _recover(self) -> None:
        self._reset()
        t0 = time.monotonic()
        batches = events = skipped = 0
        # A message that does not decode was dead-lettered by the live consumer already: the rebuild skips it.
        async for record in replay_async(self.kafka, self.topics.batches, idle_timeout_s=REBUILD_IDLE_S):
            event = record.event
            if event is None:
                skipped += 1
                continue
            assert isinstance(event, TrajectoryBatch)
            table = load_batch_table(event).select(["group_id", "session_id"])
            self.assembler.mark_emitted(
                set(table.column("group_id").to_pylist()), set(table.column("session_id").to_pylist())
            )
            if "rollout_step" in event.metrics:
                self.selector.mark_step_done(int(event.metrics["rollout_step"]))
            if event.step + 1 >= self.step:
                self._dropped_reported = int(event.metrics.get("groups.dropped_zero_signal_total", 0))
            self.step = max(self.step, event.step + 1)
            batches += 1
        async for record in replay_async(self.kafka, self.topics.inputs, idle_timeout_s=REBUILD_IDLE_S):
            if record.event is None:
                skipped += 1
                continue
            self._observe(record.event)
            events += 1
        if skipped:
            log.warning("undecodable messages skipped while rebuilding", count=skipped)
        # Before the scheduler's first tick, so it knows of the drops and skipped steps (its lag bound counts them).
        # A batch this completes is produced with the next input batch (it needs a transaction).
        self._take_ready()
        self._update_depths()
        log.info(
            "state rebuilt from topics",
            batches=batches,
            events=events,
            step=self.step,
            seconds=round(time.monotonic() - t0, 3),
        )

    def _observe(self, event: Event) -> None:
        if isinstance(event, WeightsPublished):
            self.learner_version = max(self.learner_version, event.version)
        if isinstance(event, SessionStateChanged | SessionFinished):
            self.metrics.observe_session(event)
        if isinstance(event, SessionFinished):
            self._finished_at.setdefault(event.session_id, time.monotonic())
        if self.scheduler is not None:
            self.scheduler.observe(event)
        if not isinstance(event, SessionStateChanged | SessionCancelRequested | WeightsPublished):
            self.assembler.add(event)

    def _expire_missing_calls(self) -> None:
        grace = self.settings.missing_calls_grace_s
        now = time.monotonic()
        for sid in self.assembler.incomplete_sessions():
            if now - self._finished_at.get(sid, now) >= grace:
                log.warning("giving up on missing model calls", session_id=sid)
                self.assembler.expire(sid)

    def _take_ready(self) -> None:
        """Take every complete group out of the assembler: eval groups are measured, train groups selected."""
        for group_id in self.assembler.ready_groups():
            group = self.assembler.take(group_id)
            if self.settings.dataset_dir:
                write_group(self.settings.dataset_dir, group)
            if group.kind == "eval":
                # Eval groups measure the policy; they never become training data.
                self.metrics.observe_eval(group)
                continue
            selection = self.selector.add(group)
            self.metrics.observe_group(group, emitted=selection.kept)
            if not selection.kept:
                log.info("zero-signal group dropped", group_id=group_id, trainable=group.trainable_sessions)
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
        self._take_ready()
        produced: list[TrajectoryBatch] = []
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

    async def _schedule(self, producer: Producer) -> None:
        if self.scheduler is None:
            return
        for event in self.scheduler.tick(int(time.time() * 1000)):
            # Requests, cancels, and the ends of cancelled sessions whose node never answered (see the scheduler).
            await producer.send(self.topics.for_event(event), event)

    def _update_depths(self) -> None:
        in_flight = len(self.scheduler.groups) if self.scheduler else 0
        self.metrics.set_depths(self.assembler.groups_waiting(), in_flight, self.learner_version)

    def snapshot(self) -> dict[str, Any]:
        out = self.metrics.snapshot()
        out["step"] = self.step
        out["builder"] = self.settings.builder
        out["groups_buffered"] = self.selector.buffered()
        out["group_selection"] = self.selector.snapshot()
        out["sessions_pending"] = self.assembler.pending_sessions()
        if self.scheduler is not None:
            out["scheduler"] = self.scheduler.snapshot()
        return out
