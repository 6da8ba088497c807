"""The topics one rollout deployment uses (optionally suffixed, so tests and side runs do not share them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contracts import (
    MODEL_CALLS,
    REWARDS,
    ROLLOUT_GROUPS,
    SESSIONS_CANCEL,
    SESSIONS_FINISHED,
    SESSIONS_REQUESTED,
    SESSIONS_STATE,
    TRAJECTORY_BATCHES,
    WEIGHTS,
    Event,
    Topic,
)

__all__ = ["Topics"]


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
    groups: Topic[Any]

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
            t(ROLLOUT_GROUPS),
        )

    def for_event(self, event: Event) -> Topic[Any]:
        """The topic an event of this type is published to."""
        for topic in self.all:
            if isinstance(event, topic.model):
                return topic
        raise KeyError(f"no rollout topic carries {type(event).__name__}")

    @property
    def inputs(self) -> list[Topic[Any]]:
        """Everything the rollout reads that others publish (and its own scheduling output)."""
        return [self.requested, self.cancel, self.state, self.finished, self.calls, self.rewards, self.weights]

    @property
    def all(self) -> list[Topic[Any]]:
        return [*self.inputs, self.groups, self.batches]
