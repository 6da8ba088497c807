"""Stage 1 of the rollout: assemble the groups of the partitions this instance owns, exactly once.

Every rollout instance runs one shard. The shards share the group-keyed topics (``sessions.requested``,
``sessions.finished``, ``model-calls``, ``rewards``) through one consumer group with the *range* assignor: those
topics have equal partition counts and are keyed by group id, so partition ``p`` of each goes to the same shard and
a group's requests, ends, calls and rewards all reach the one shard that owns ``hash(group) % partitions``.

Each input batch is one Kafka transaction: the ``GroupAssembled`` events it completes go to ``floe.rollout.groups``
together with the input offsets. The assembler's state spans transactions, so it is **rebuilt** whenever the shard's
assignment changes (start, rebalance, a member joining or dying) and after an aborted transaction:

1. the groups topic is read to its end (``read_committed``): every group already assembled, by any shard, is
   marked emitted;
2. the owned partitions of the inputs are read to their end into the assembler (duplicates are ignored).

Rebalances happen only inside a poll, between transactions (``TransactionalProcessor.assignment_epoch``), so no
transaction is open across one; a zombie that lost its partitions is fenced when it commits (the offsets carry its
group generation) and its transaction is aborted. A group is therefore assembled once, by whoever owns it when its
last event commits, whether that is the shard that saw its first event or the one its partition moved to.

A group completed only by a timer (missing calls given up on) is published with the shard's next input batch.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from typing import Any

import structlog

from contracts import Event, GroupAssembled, ModelCallRecorded, RewardPublished, SessionFinished, SessionRequested
from eventbus import KafkaSettings, TransactionalProcessor
from eventbus.replay import replay_async
from rollout.assembled import to_event
from rollout.dataset import write_group
from rollout.groups import GroupAssembler
from rollout.recovery import REBUILD_IDLE_S, Stopped, retry_rebuild
from rollout.settings import RolloutSettings
from rollout.topics import Topics

__all__ = ["AssemblerShard"]

log = structlog.get_logger()


class AssemblerShard:
    def __init__(self, settings: RolloutSettings, kafka: KafkaSettings, topics: Topics) -> None:
        self.settings = settings
        self.kafka = kafka
        self.topics = topics
        self.ready = asyncio.Event()
        self.owned: frozenset[tuple[str, int]] = frozenset()
        self.assembled = 0  # groups this shard published (this incarnation)
        self.rebuilds = 0
        self._stop = asyncio.Event()
        self._reset()

    def _reset(self) -> None:
        s = self.settings
        self.assembler = GroupAssembler(s.builder, s.advantage, s.eot_token_ids)
        self._finished_at: dict[str, float] = {}

    @property
    def inputs(self) -> list[Any]:
        t = self.topics
        return [t.requested, t.finished, t.calls, t.rewards]

    async def run(self, stop: asyncio.Event) -> None:
        s = self.settings
        self._stop = stop
        async with TransactionalProcessor(
            self.kafka,
            self.inputs,
            group_id=s.group_id,
            transactional_id=s.instance_id,
            outputs=[self.topics.groups],
            max_batch=500,
            transaction_timeout_s=s.transaction_timeout_s,
            # Static membership turns a session timeout during a broker restart into a fatal "static consumer
            # fenced" error (seen in tests/e2e); a dynamic member just rejoins. Zombies are still fenced by the
            # transactional id and the group generation sent with the offsets.
            static_membership=False,
            # Range: partition p of every input goes to the same member, so a group's topics meet in one shard.
            consumer_overrides={"partition.assignment.strategy": "range"},
        ) as tp:
            epoch = -1
            try:
                while not stop.is_set():
                    async for batch in tp.batches(timeout_s=s.tick_s):
                        if tp.assignment_epoch != epoch:
                            epoch = tp.assignment_epoch
                            await self._recover(tp.assignment)
                        for msg in batch:
                            self._observe(msg.event)
                        self._expire_missing_calls()
                        produced = self._emit(tp)
                        if not await tp.commit(batch):
                            log.warning("shard transaction aborted; rebuilding its groups from the topics")
                            epoch = tp.assignment_epoch
                            await self._recover(tp.assignment)
                        else:
                            self.assembled += produced
                        if stop.is_set():
                            break
                    if tp.assignment_epoch != epoch:
                        epoch = tp.assignment_epoch
                        await self._recover(tp.assignment)
                    self._expire_missing_calls()
            except Stopped:
                log.info("shard stopped while waiting for the broker")

    async def _recover(self, owned: frozenset[tuple[str, int]]) -> None:
        """Rebuild, retrying while the broker cannot be reached (a rebalance is what a broker outage ends with)."""
        await retry_rebuild(lambda: self._rebuild(owned), self._stop, "shard")

    async def _rebuild(self, owned: frozenset[tuple[str, int]]) -> None:
        self._reset()
        self.owned = owned
        self.rebuilds += 1
        t0 = time.monotonic()
        groups = events = skipped = 0
        # To its end (retried while a dead shard's open transaction holds it back): a group assembled behind it would
        # be assembled again, and nothing else brings this shard the groups topic.
        groups_topic = replay_async(self.kafka, self.topics.groups, idle_timeout_s=REBUILD_IDLE_S, require_end=True)
        async for record in groups_topic:
            event = record.event
            if event is None:
                skipped += 1
                continue
            assert isinstance(event, GroupAssembled)
            self.assembler.mark_emitted([event.group_id], [s.session_id for s in event.sessions])
            groups += 1
        partitions: dict[tuple[int, ...], list[Any]] = defaultdict(list)
        for topic in self.inputs:
            mine = tuple(sorted(p for name, p in owned if name == topic.name))
            if mine:
                partitions[mine].append(topic)
        for mine, topics in partitions.items():
            async for record in replay_async(self.kafka, topics, partitions=list(mine), idle_timeout_s=REBUILD_IDLE_S):
                if record.event is None:
                    skipped += 1
                    continue
                self._observe(record.event)
                events += 1
        if skipped:
            log.warning("undecodable messages skipped while rebuilding", count=skipped)
        log.info(
            "shard rebuilt from topics",
            partitions=len(owned),
            groups_known=groups,
            events=events,
            groups_waiting=self.assembler.groups_waiting(),
            seconds=round(time.monotonic() - t0, 3),
        )
        self.ready.set()

    def _observe(self, event: Event) -> None:
        if isinstance(event, SessionFinished):
            self._finished_at.setdefault(event.session_id, time.monotonic())
        if isinstance(event, SessionRequested | SessionFinished | ModelCallRecorded | RewardPublished):
            self.assembler.add(event)

    def _expire_missing_calls(self) -> None:
        grace = self.settings.missing_calls_grace_s
        now = time.monotonic()
        for sid in self.assembler.incomplete_sessions():
            if now - self._finished_at.get(sid, now) >= grace:
                log.warning("giving up on missing model calls", session_id=sid)
                self.assembler.expire(sid)

    def _emit(self, tp: TransactionalProcessor[Any]) -> int:
        s = self.settings
        n = 0
        for group_id in self.assembler.ready_groups():
            group = self.assembler.take(group_id)
            if s.dataset_dir:
                write_group(s.dataset_dir, group)
            event = to_event(
                group,
                s.builder,
                inline_max_bytes=s.inline_max_bytes,
                claim_url=s.claim_url,
                compression=s.compression,
            )
            tp.produce(self.topics.groups, event)
            log.info("group assembled", group_id=group_id, sessions=len(group.sessions), inline=event.uri is None)
            n += 1
        return n

    def snapshot(self) -> dict[str, Any]:
        return {
            "partitions": sorted(f"{t}[{p}]" for t, p in self.owned),
            "groups_waiting": self.assembler.groups_waiting(),
            "sessions_pending": self.assembler.pending_sessions(),
            "groups_assembled": self.assembled,
            "rebuilds": self.rebuilds,
        }
