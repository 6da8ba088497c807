"""Which assembled train groups go into trajectory batches, and when a batch is due (pure: groups in, batches out).

A *zero-signal* group (fewer than two trainable sessions, or all their rewards equal: all wrong or all right, see
``contracts.advantages``) has advantage 0 everywhere, so it adds no policy gradient. ``group_selection`` says what
happens to it:

- ``off``: it goes into batches like any group (it still weighs in the loss normalisation).
- ``refill`` (DAPO dynamic sampling, the default): it is dropped and the scheduler is told (``Selection.refill``),
  so it no longer counts toward its step and a replacement group is admitted; batches are ``groups_per_batch`` kept
  groups in completion order, so every batch is full and every group in it has signal.
- ``drop`` (Polar): it is dropped without replacement. A step is exactly the ``groups_per_step`` train groups
  admitted for it (``SessionRequested.rollout_step``); once all of them have completed, the step's kept groups are
  one batch (smaller than ``groups_per_step`` when some were dropped; ``groups_per_batch`` is not used), in group-id
  order. **A step whose groups were all dropped** produces no batch: there is nothing to train on, and an empty or
  zero-advantage batch would still move the weights (optimizer momentum, weight decay) and claim a version for data
  that was thrown away. The step is reported as *skipped* (``Selection.skipped_step``) and the scheduler's lag bound
  stops waiting for its version (see ``rollout.scheduler``). The learner's versions therefore count batches, not
  rollout steps; each drop batch names its step in ``metrics["rollout_step"]``.

Dropped groups are still written to the Parquet dataset (an all-solved group is good SFT data) and counted. Groups
that carry no ``train_index`` (requests not made by this rollout's scheduler) are batched by count in every mode.

Rebuild: a dropped group is never on the output topic, so after a restart its events are replayed and it is dropped
again (the same decision: it depends only on its rewards); ``mark_step_done`` marks the steps whose batch is already
published, so a re-dropped group of such a step is not counted into a new one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from rollout.groups import GroupResult

__all__ = ["GROUP_SELECTIONS", "GroupSelection", "GroupSelector", "PendingBatch", "Selection", "train_index_of"]

GroupSelection = Literal["off", "drop", "refill"]
GROUP_SELECTIONS: tuple[GroupSelection, ...] = get_args(GroupSelection)


def train_index_of(group: GroupResult) -> int | None:
    """The group's position among the scheduler's train groups (None: not scheduled by this rollout)."""
    raw = group.metadata.get("train_index", "")
    return int(raw) if raw.isdigit() else None


@dataclass(frozen=True)
class Selection:
    kept: bool
    refill: int | None = None  # refill: the dropped group's train_index, for ``Scheduler.group_dropped``
    skipped_step: int | None = None  # drop: this group completed a step with no kept group (``Scheduler.step_skipped``)


@dataclass(frozen=True)
class PendingBatch:
    groups: list[GroupResult]
    rollout_step: int | None = None  # drop: the step this batch is; None for batches made by count


@dataclass
class _Step:
    members: set[str] = field(default_factory=set)
    kept: list[GroupResult] = field(default_factory=list)


class GroupSelector:
    def __init__(self, mode: GroupSelection, groups_per_batch: int, groups_per_step: int) -> None:
        if mode not in GROUP_SELECTIONS:
            raise ValueError(f"unknown group selection {mode!r}; choose one of {GROUP_SELECTIONS}")
        self.mode: GroupSelection = mode
        self.groups_per_batch = groups_per_batch
        self.groups_per_step = groups_per_step
        self.buffer: list[GroupResult] = []
        self.dropped: set[str] = set()  # group ids, so a group re-taken after a rebuild counts once
        self.skipped_steps: set[int] = set()
        self._steps: dict[int, _Step] = {}
        self._steps_done: set[int] = set()
        self._ready: list[PendingBatch] = []

    def add(self, group: GroupResult) -> Selection:
        """One assembled train group: keep it (buffered until its batch is due) or drop it."""
        drop = group.zero_signal and self.mode != "off"
        if drop:
            self.dropped.add(group.group_id)
        index = train_index_of(group)
        if self.mode == "drop" and index is not None:
            return self._add_to_step(group, drop)
        if not drop:
            self.buffer.append(group)
        return Selection(kept=not drop, refill=index if drop and self.mode == "refill" else None)

    def _add_to_step(self, group: GroupResult, drop: bool) -> Selection:
        step = group.rollout_step
        if step in self._steps_done:
            # Only a re-dropped group of a published step gets here (its kept groups are marked emitted); a kept one
            # would mean the step size changed between incarnations: batch it by count rather than lose it.
            if not drop:
                self.buffer.append(group)
            return Selection(kept=not drop)
        st = self._steps.setdefault(step, _Step())
        if group.group_id in st.members:
            return Selection(kept=not drop)
        st.members.add(group.group_id)
        if not drop:
            st.kept.append(group)
        if len(st.members) < self.groups_per_step:
            return Selection(kept=not drop)
        del self._steps[step]
        self._steps_done.add(step)
        if st.kept:
            self._ready.append(PendingBatch(sorted(st.kept, key=lambda g: g.group_id), step))
            return Selection(kept=not drop)
        self.skipped_steps.add(step)
        return Selection(kept=False, skipped_step=step)

    def mark_step_done(self, step: int) -> None:
        """Rebuild: the batch of ``step`` is on the output topic already."""
        self._steps_done.add(step)
        self._steps.pop(step, None)

    def take_batches(self) -> list[PendingBatch]:
        """The batches due now: completed steps (drop), then full ``groups_per_batch`` chunks of the buffer."""
        out, self._ready = self._ready, []
        while len(self.buffer) >= self.groups_per_batch:
            chunk, self.buffer = self.buffer[: self.groups_per_batch], self.buffer[self.groups_per_batch :]
            out.append(PendingBatch(chunk))
        return out

    def buffered(self) -> int:
        """Kept groups waiting for their batch."""
        return len(self.buffer) + sum(len(st.kept) for st in self._steps.values())

    def snapshot(self) -> dict[str, object]:
        return {
            "mode": self.mode,
            "groups_dropped_zero_signal": len(self.dropped),
            "groups_buffered": self.buffered(),
            "steps_open": sorted(self._steps),
            "steps_skipped": sorted(self.skipped_steps),
        }
