"""The topic registry: one place that says, for every topic, its name, event type, key, partitions and config.

A topic is a value (``Topic``), not a string: producers and consumers take a ``Topic`` so name, encoding and key
cannot drift apart. ``eventbus`` creates topics from this registry; ``floe topics create`` does the same by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from contracts.events import (
    DeadLetter,
    Event,
    GroupAssembled,
    ModelCallRecorded,
    RewardPublished,
    SessionCancelRequested,
    SessionFinished,
    SessionRequested,
    SessionStateChanged,
    TrajectoryBatch,
    WeightsPublished,
)

__all__ = [
    "DEAD_LETTER",
    "MODEL_CALLS",
    "REWARDS",
    "ROLLOUT_GROUPS",
    "SESSIONS_CANCEL",
    "SESSIONS_FINISHED",
    "SESSIONS_REQUESTED",
    "SESSIONS_STATE",
    "TOPICS",
    "TRAJECTORY_BATCHES",
    "WEIGHTS",
    "Topic",
    "topic_by_name",
]

E = TypeVar("E", bound=Event)

MiB = 1024 * 1024
DAY_MS = 24 * 3600 * 1000


@dataclass(frozen=True)
class Topic(Generic[E]):
    """A Kafka topic and the one event type it carries.

    ``key_field`` names the event attribute used as the Kafka key (ordering is per key). ``config`` is the topic
    config applied at creation (retention, max.message.bytes, cleanup.policy).
    """

    name: str
    model: type[E]
    key_field: str
    partitions: int = 1
    retention_ms: int = 7 * DAY_MS
    max_message_bytes: int = 1 * MiB
    compacted: bool = False
    extra_config: dict[str, str] = field(default_factory=dict)
    fallback_key_field: str | None = None  # used when ``key_field`` is empty (records of an older version)

    def key_of(self, event: E) -> bytes:
        value = getattr(event, self.key_field)
        if not value and self.fallback_key_field:
            value = getattr(event, self.fallback_key_field)
        return str(value).encode()

    def with_name(self, name: str) -> Topic[E]:
        """The same topic under another name (tests use uuid-suffixed copies; replay writes to side topics)."""
        return Topic(
            name=name,
            model=self.model,
            key_field=self.key_field,
            partitions=self.partitions,
            retention_ms=self.retention_ms,
            max_message_bytes=self.max_message_bytes,
            compacted=self.compacted,
            extra_config=dict(self.extra_config),
            fallback_key_field=self.fallback_key_field,
        )

    @property
    def config(self) -> dict[str, str]:
        cfg = {
            "retention.ms": str(self.retention_ms),
            "max.message.bytes": str(self.max_message_bytes),
            "cleanup.policy": "compact" if self.compacted else "delete",
        }
        cfg.update(self.extra_config)
        return cfg

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "event": self.model.__name__,
            "key": self.key_field,
            "partitions": self.partitions,
            **self.config,
        }


# Group-scoped topics are keyed by group id: all of a group's requests, state changes, ends, calls and rewards land on
# partition hash(group) of each of them, so with equal partition counts (and the range assignor) one rollout shard
# sees the whole group. Order per session is kept (a session's events share its group's key).
SESSIONS_REQUESTED = Topic(
    "floe.sessions.requested", SessionRequested, "group_id", partitions=8, retention_ms=DAY_MS * 3
)
# Every gateway node reads every cancel request (each with its own group), so one partition is plenty.
SESSIONS_CANCEL = Topic("floe.sessions.cancel", SessionCancelRequested, "session_id", partitions=1, retention_ms=DAY_MS)
SESSIONS_STATE = Topic("floe.sessions.state", SessionStateChanged, "group_id", partitions=8)
SESSIONS_FINISHED = Topic(
    "floe.sessions.finished", SessionFinished, "group_id", partitions=8, max_message_bytes=16 * MiB
)
# A call record before v3 has no group id: it is keyed by its session (``fallback_key_field``).
MODEL_CALLS = Topic(
    "floe.model-calls",
    ModelCallRecorded,
    "group_id",
    partitions=8,
    max_message_bytes=16 * MiB,
    fallback_key_field="session_id",
)
REWARDS = Topic("floe.rewards", RewardPublished, "group_id", partitions=8)
# Rollout shards -> rollout leader: one partition, so one leader (its owner) selects, numbers and batches.
ROLLOUT_GROUPS = Topic("floe.rollout.groups", GroupAssembled, "group_id", partitions=1, max_message_bytes=16 * MiB)
# One partition: batches are consumed in order by the learner; above 16 MiB they go by claim check.
TRAJECTORY_BATCHES = Topic(
    "floe.trajectory-batches", TrajectoryBatch, "batch_id", partitions=1, max_message_bytes=16 * MiB
)
# Compacted with a constant key ("policy"): the latest version survives forever, so an engine that starts late
# still finds it.
WEIGHTS = Topic("floe.weights", WeightsPublished, "base_model", partitions=1, compacted=True, retention_ms=-1)
DEAD_LETTER = Topic("floe.dead-letter", DeadLetter, "source_topic", partitions=1, max_message_bytes=32 * MiB)

TOPICS: tuple[Topic[Any], ...] = (
    SESSIONS_REQUESTED,
    SESSIONS_CANCEL,
    SESSIONS_STATE,
    SESSIONS_FINISHED,
    MODEL_CALLS,
    REWARDS,
    ROLLOUT_GROUPS,
    TRAJECTORY_BATCHES,
    WEIGHTS,
    DEAD_LETTER,
)


def topic_by_name(name: str) -> Topic[Any]:
    for topic in TOPICS:
        if topic.name == name:
            return topic
    raise KeyError(f"unknown topic {name!r}; known: {', '.join(t.name for t in TOPICS)}")
