"""The rollout service: schedule sessions, assemble groups, publish trajectory batches exactly once.

Data path (exactly once), in two stages::

    sessions.requested, sessions.finished, model-calls, rewards      (keyed by group id)
        └─ shard (any number: one consumer group, range assignor) ─▶ GroupAssembled ─▶ floe.rollout.groups
    floe.rollout.groups (one partition)
        └─ leader (the owner of that partition) ─▶ selection ─▶ TrajectoryBatch (+ Parquet, claim checks)
    sessions.requested, .cancel, .state, .finished, weights           (every partition, no group)
        └─ leader's scheduler ─▶ SessionRequested / SessionCancelRequested

Every instance runs both stages (``rollout.shard``, ``rollout.leader``): the shards share the assembling, which is
most of the work (rebuilding requests and prompts, building rows); one of them also leads. Killing any instance
moves its partitions (and, for the leader, the leadership) to the others, which rebuild what they now own from the
topics; each stage's outputs commit with its inputs' offsets in one transaction, so no group and no batch is lost
or published twice across the move. Batch ids and bytes are deterministic functions of their groups; the Parquet
dataset is keyed by group id and claim-check files by content, so a rebuilt group overwrites rather than duplicates.

Each instance needs its own ``instance_id`` (the shard's transactional id; the leader uses ``<instance_id>-leader``)
and all share ``group_id``. Limits: groups completed only by a timer (missing calls expired) are published with
the shard's next input batch; the rebuilds read everything the topics retain.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from eventbus import KafkaSettings, ensure_topics
from rollout.leader import Leader
from rollout.metrics import RolloutMetrics
from rollout.scheduler import RunSpec, SchedulerConfig
from rollout.settings import RolloutSettings, RunSettings
from rollout.shard import AssemblerShard
from rollout.topics import Topics

__all__ = ["RolloutService", "Topics", "run_specs"]

log = structlog.get_logger()


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
        scheduler_config = SchedulerConfig(
            max_groups_in_flight=settings.max_groups_in_flight,
            max_off_policy_steps=settings.max_off_policy_steps,
            groups_per_step=settings.groups_per_step,
            min_usable_fraction=settings.min_usable_fraction,
            grace_sessions=settings.grace_sessions,
            group_deadline_s=settings.group_deadline_s,
            cancel_grace_s=settings.cancel_grace_s,
            max_steps=settings.max_steps,
        )
        specs = run_specs(settings.runs) if settings.schedule else []
        self.shard = AssemblerShard(settings, kafka, self.topics)
        self.leader = Leader(
            settings,
            kafka,
            self.topics,
            self.metrics,
            specs,
            scheduler_config,
            groups_waiting=lambda: self.shard.assembler.groups_waiting(),
        )
        self.ready = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        await ensure_topics(self.kafka, self.topics.all)
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.shard.run(stop), name="rollout shard")
            tg.create_task(self.leader.run(stop), name="rollout leader")
            tg.create_task(self._announce_ready(), name="rollout ready")

    async def _announce_ready(self) -> None:
        await self.shard.ready.wait()
        await self.leader.decided.wait()
        self.ready.set()
        log.info(
            "rollout service ready",
            leader=self.leader.active,
            step=self.leader.step,
            partitions=len(self.shard.owned),
            groups_waiting=self.shard.assembler.groups_waiting(),
        )

    @property
    def step(self) -> int:
        return self.leader.step

    def snapshot(self) -> dict[str, Any]:
        out = self.metrics.snapshot()
        out["instance_id"] = self.settings.instance_id
        out["builder"] = self.settings.builder
        out["shard"] = self.shard.snapshot()
        out["leader"] = self.leader.active
        out["sessions_pending"] = self.shard.assembler.pending_sessions()
        lead = self.leader.snapshot()
        for key in ("step", "groups_buffered", "group_selection", "scheduler"):
            if key in lead:
                out[key] = lead[key]
        return out
