"""Which tasks run, when, and when to stop waiting for them (pure: time is passed in, events are returned).

A *run* (``RunSpec``) is a stream of GRPO groups: a task list, a harness preset, a sampling policy and a group size G.
Each admitted group is G ``SessionRequested`` events with deterministic ids (``<run>-<n>`` and ``<run>-<n>-<i>``),
so re-publishing after a crash never starts a second session.

**Admission** (``tick``) is paced by the learner, not by discarding data (peers.md §2.4, tinker-cookbook#822):
- at most ``max_groups_in_flight`` groups are in flight (requested, not every session ended);
- a *train* group for rollout step ``s = train_groups_admitted // groups_per_step`` is admitted only while
  ``s - learner_version <= max_off_policy_steps`` (the learner's version comes from ``WeightsPublished``), so data is
  at most that many updates stale when it was requested (per-call staleness is still stamped on every model call);
- *eval* runs take priority: their groups are admitted first, ignore the lag bound, and carry priority 100.

**Stragglers** (``min_usable_fraction`` < 1): once ``k = min(G, ceil(G * fraction) + grace_sessions)`` sessions of a
group are *usable* (``DONE`` with at least one model call), the group's remaining sessions are cancelled
(``SessionCancelRequested``). **Group deadline**: ``group_deadline_s`` after admission every unfinished session of the
group is cancelled, so one stuck session can never wedge a step (NeMo-RL#3238).

What this does to the data (said plainly): a cancelled session is kept in its group but *masked* (no gradient); a
session that finished before the cut-off is never discarded, however slow. Cutting stragglers therefore biases the
gradient towards tasks and attempts that finish quickly (long, often harder, attempts are under-represented among
trainable samples): with ``min_usable_fraction=1.0`` (the default) only the deadline cuts, and the bias is limited to
sessions slower than the deadline. The cut rate is exported (``cancelled_straggler`` / ``cancelled_deadline``) so it
can be watched.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass, field

from contracts import (
    TERMINAL_STATES,
    Event,
    SamplingPolicy,
    SessionCancelRequested,
    SessionFinished,
    SessionKind,
    SessionRequested,
    SessionState,
    SessionStateChanged,
    TokenizationMode,
    WeightsPublished,
)

__all__ = ["RunSpec", "Scheduler", "SchedulerConfig"]


@dataclass(frozen=True)
class RunSpec:
    name: str
    task_ids: tuple[str, ...]
    harness: str = "pi"
    kind: SessionKind = SessionKind.TRAIN
    group_size: int = 8
    task_source: str = "bundled"
    sampling: SamplingPolicy = field(default_factory=SamplingPolicy)
    tokenization: TokenizationMode = TokenizationMode.EXACT
    model: str = "floe-policy"
    agent_timeout_s: float = 600.0
    session_timeout_s: float = 1800.0
    epochs: int | None = None  # None: cycle forever (train); eval runs default to one pass
    shuffle_seed: int | None = 0

    def __post_init__(self) -> None:
        if not self.task_ids:
            raise ValueError(f"run {self.name!r} has no tasks")
        if self.group_size < 1:
            raise ValueError("group_size must be >= 1")

    def task_for(self, n: int) -> str | None:
        """The task of this run's n-th group, or None when the run is exhausted."""
        epochs = self.epochs if self.epochs is not None else (1 if self.kind is SessionKind.EVAL else None)
        epoch, i = divmod(n, len(self.task_ids))
        if epochs is not None and epoch >= epochs:
            return None
        order = list(self.task_ids)
        if self.shuffle_seed is not None and self.kind is SessionKind.TRAIN:
            random.Random(f"{self.shuffle_seed}/{epoch}").shuffle(order)
        return order[i]


@dataclass(frozen=True)
class SchedulerConfig:
    max_groups_in_flight: int = 8
    max_off_policy_steps: int = 3
    groups_per_step: int = 4
    min_usable_fraction: float = 1.0
    grace_sessions: int = 0
    group_deadline_s: float = 3600.0
    cancel_grace_s: float = 60.0


def _session_id(group_id: str, index: int) -> str:
    """The deterministic id of a group's ``index``-th session (admission and re-publication must agree on it)."""
    return f"{group_id}-{index:02d}"


@dataclass
class _Group:
    group_id: str
    run: str
    kind: SessionKind
    size: int
    admitted_at: int
    sessions: dict[str, SessionState] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    usable: set[str] = field(default_factory=set)
    cancelled: set[str] = field(default_factory=set)
    cancel_reason: str | None = None
    cancelled_at: int | None = None
    closed: set[str] = field(default_factory=set)  # sessions we ended ourselves (their node never did)
    task_id: str = ""
    task_source: str = ""
    harness: str = ""
    template: SessionRequested | None = None  # the first request seen: how to re-publish a missing member

    def open_sessions(self) -> list[str]:
        return sorted(s for s, st in self.sessions.items() if st not in TERMINAL_STATES)

    @property
    def done(self) -> bool:
        return len(self.sessions) >= self.size and not self.open_sessions()


class Scheduler:
    def __init__(self, config: SchedulerConfig, runs: list[RunSpec]) -> None:
        names = [r.name for r in runs]
        if len(set(names)) != len(names):
            raise ValueError("run names must be unique")
        self.config = config
        self.runs = {r.name: r for r in runs}
        self.learner_version = 0
        self.admitted: Counter[str] = Counter()  # groups admitted per run
        self.train_groups_admitted = 0
        self.groups: dict[str, _Group] = {}  # in flight
        self.session_group: dict[str, str] = {}
        self.counters: Counter[str] = Counter()
        self.states: Counter[str] = Counter()
        # A rebuild reads the topics in no particular order, so a session's end can come before its request.
        self._early_ends: dict[str, SessionFinished] = {}

    # ------------------------------------------------------------------------------------------------- intake
    def observe(self, event: Event) -> None:
        """Feed every event the scheduler cares about; also how state is rebuilt from the topics after a restart
        (our own ``SessionRequested`` / ``SessionCancelRequested`` included)."""
        if isinstance(event, WeightsPublished):
            self.learner_version = max(self.learner_version, event.version)
        elif isinstance(event, SessionRequested):
            self._register(event)
        elif isinstance(event, SessionCancelRequested):
            group = self._group_of(event.session_id)
            if group is not None:
                group.cancelled.add(event.session_id)
                group.cancelled_at = min(group.cancelled_at or event.requested_at, event.requested_at)
        elif isinstance(event, SessionStateChanged):
            group = self._group_of(event.session_id)
            if group is not None and group.sessions.get(event.session_id) not in TERMINAL_STATES:
                self._set_state(group, event.session_id, event.state)
        elif isinstance(event, SessionFinished):
            group = self._group_of(event.session_id)
            if group is None and event.session_id not in self.session_group:
                self._early_ends.setdefault(event.session_id, event)
            if group is not None:
                self._set_state(group, event.session_id, event.status)
                group.calls[event.session_id] = event.calls
                if event.status is SessionState.DONE and event.calls > 0:
                    group.usable.add(event.session_id)
                if group.done:
                    del self.groups[group.group_id]
                    self.counters["groups_done"] += 1

    def _register(self, req: SessionRequested) -> None:
        group = self.groups.get(req.group_id)
        if group is None:
            if req.session_id in self.session_group:
                return  # a redelivered request of a group that already ended
            run = req.metadata.get("run", "")
            size = int(req.metadata.get("group_size", "1") or 1)
            group = self.groups[req.group_id] = _Group(req.group_id, run, req.kind, size, req.requested_at)
            group.task_id, group.task_source, group.harness = req.task_id, req.task_source, req.harness
            group.template = req
            n = int(req.metadata.get("group_index", "-1"))
            if run in self.runs and n >= 0:
                self.admitted[run] = max(self.admitted[run], n + 1)
                if req.kind is SessionKind.TRAIN:
                    self.train_groups_admitted = max(
                        self.train_groups_admitted, int(req.metadata.get("train_index", "-1")) + 1
                    )
        if req.session_id not in group.sessions:
            group.sessions[req.session_id] = SessionState.REQUESTED
            self.session_group[req.session_id] = req.group_id
            self.states[SessionState.REQUESTED.value] += 1
            early = self._early_ends.pop(req.session_id, None)
            if early is not None:
                self.observe(early)

    def _set_state(self, group: _Group, session_id: str, state: SessionState) -> None:
        old = group.sessions.get(session_id)
        if old is not None:
            self.states[old.value] -= 1
        group.sessions[session_id] = state
        self.states[state.value] += 1

    def _group_of(self, session_id: str) -> _Group | None:
        gid = self.session_group.get(session_id)
        return self.groups.get(gid) if gid else None

    # ------------------------------------------------------------------------------------------------- output
    def tick(self, now_ms: int) -> list[Event]:
        out: list[Event] = self._complete_partial_groups()
        out.extend(self._cancellations(now_ms))
        while len(self.groups) < self.config.max_groups_in_flight:
            admitted = self._admit_one(now_ms)
            if not admitted:
                break
            out.extend(admitted)
        return out

    def _admit_one(self, now_ms: int) -> list[Event]:
        runs = sorted(self.runs.values(), key=lambda r: (r.kind is not SessionKind.EVAL, r.name))
        for run in runs:
            n = self.admitted[run.name]
            task = run.task_for(n)
            if task is None:
                continue
            step = self.train_groups_admitted // self.config.groups_per_step
            if run.kind is SessionKind.TRAIN and step - self.learner_version > self.config.max_off_policy_steps:
                self.counters["admission_blocked_by_lag"] += 1
                continue
            return self._requests(run, n, task, step, now_ms)
        return []

    def _requests(self, run: RunSpec, n: int, task: str, step: int, now_ms: int) -> list[Event]:
        group_id = f"{run.name}-{n:06d}"
        meta = {"group_size": str(run.group_size), "run": run.name, "group_index": str(n)}
        if run.kind is SessionKind.TRAIN:
            meta["train_index"] = str(self.train_groups_admitted)
        events: list[Event] = [
            SessionRequested(
                session_id=_session_id(group_id, i),
                group_id=group_id,
                task_id=task,
                task_source=run.task_source,
                harness=run.harness,
                kind=run.kind,
                priority=100 if run.kind is SessionKind.EVAL else 0,
                sampling=run.sampling,
                tokenization=run.tokenization,
                agent_timeout_s=run.agent_timeout_s,
                session_timeout_s=run.session_timeout_s,
                policy_version=self.learner_version,
                rollout_step=step if run.kind is SessionKind.TRAIN else 0,
                model=run.model,
                requested_at=now_ms,
                metadata=meta,
            )
            for i in range(run.group_size)
        ]
        for event in events:
            assert isinstance(event, SessionRequested)
            self._register(event)
        self.counters[f"groups_admitted_{run.kind.value}"] += 1
        return events

    def _complete_partial_groups(self) -> list[Event]:
        """Re-publish the members missing from a group of ours: the rollout died between sending a group's G
        requests, and a group with fewer than G sessions would never complete (nor free its slot). The ids are
        deterministic, so a member whose request did land after all is deduplicated by the node that runs it."""
        out: list[Event] = []
        for group in self.groups.values():
            if len(group.sessions) >= group.size or group.template is None or group.run not in self.runs:
                continue
            for i in range(group.size):
                sid = _session_id(group.group_id, i)
                if sid in group.sessions:
                    continue
                req = group.template.model_copy(update={"session_id": sid})
                self._register(req)
                self.counters["requests_republished"] += 1
                out.append(req)
        return out

    def _cancellations(self, now_ms: int) -> list[Event]:
        out: list[Event] = []
        cfg = self.config
        for group in self.groups.values():
            out.extend(self._close_unanswered(group, now_ms))
            open_sessions = [s for s in group.open_sessions() if s not in group.cancelled]
            if not open_sessions:
                continue
            reason: str | None = None
            if now_ms - group.admitted_at >= cfg.group_deadline_s * 1000:
                reason = "group_deadline"
            elif cfg.min_usable_fraction < 1.0 and group.kind is SessionKind.TRAIN:
                k = min(group.size, math.ceil(group.size * cfg.min_usable_fraction) + cfg.grace_sessions)
                if len(group.usable) >= k:
                    reason = "straggler"
            if reason is None:
                continue
            group.cancelled_at = group.cancelled_at or now_ms
            for sid in open_sessions:
                group.cancelled.add(sid)
                self.counters[f"cancelled_{reason}"] += 1
                out.append(
                    SessionCancelRequested(session_id=sid, group_id=group.group_id, reason=reason, requested_at=now_ms)
                )
        return out

    def _close_unanswered(self, group: _Group, now_ms: int) -> list[Event]:
        """End sessions still open ``cancel_grace_s`` after we cancelled them: the node that ran them died (a
        ``kill -9`` leaves no terminal state), so nothing else ever will. The ``SessionFinished`` (CANCELLED) keeps
        them in their group as masked rows and lets the group complete; it is published, so a rebuild sees it too.
        A node that answers late publishes a second end, which every consumer ignores (first terminal end wins)."""
        if group.cancelled_at is None or now_ms - group.cancelled_at < self.config.cancel_grace_s * 1000:
            return []
        out: list[Event] = []
        for sid in group.open_sessions():
            if sid in group.cancelled and sid not in group.closed:
                group.closed.add(sid)
                self.counters["closed_unanswered"] += 1
                out.append(
                    SessionFinished(
                        session_id=sid,
                        group_id=group.group_id,
                        task_id=group.task_id,
                        task_source=group.task_source or "bundled",
                        harness=group.harness,
                        node_id="rollout",
                        status=SessionState.CANCELLED,
                        reason=f"no terminal state {self.config.cancel_grace_s:.0f}s after the cancel (node lost?)",
                        finished_at=now_ms,
                    )
                )
        return out

    # ------------------------------------------------------------------------------------------------- state
    def snapshot(self) -> dict[str, object]:
        return {
            "learner_version": self.learner_version,
            "groups_in_flight": len(self.groups),
            "train_groups_admitted": self.train_groups_admitted,
            "next_step": self.train_groups_admitted // self.config.groups_per_step,
            "sessions_by_state": {k: v for k, v in sorted(self.states.items()) if v},
            "counters": dict(sorted(self.counters.items())),
            "runs": {name: {"groups_admitted": self.admitted[name]} for name in sorted(self.runs)},
        }
