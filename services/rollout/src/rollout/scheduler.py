"""Which tasks run, when, and when to stop waiting for them (pure: time is passed in, events are returned).

A *run* (``RunSpec``) is a stream of GRPO groups: a task list, a harness preset, a sampling policy and a group size G.
Each admitted group is G ``SessionRequested`` events with deterministic ids (``<run>-<n>`` and ``<run>-<n>-<i>``),
so re-publishing after a crash never starts a second session.

**Admission** (``tick``) is paced by the learner, not by discarding data (docs/peers.md, "Pacing admission by the
learner"; tinker-cookbook#822):
- at most ``max_groups_in_flight`` groups are in flight (requested, not every session ended);
- a *train* group for rollout step ``s = train_groups_admitted // groups_per_step`` is admitted only while
  ``s - learner_version <= max_off_policy_steps`` (the learner's version comes from ``WeightsPublished``), so data is
  at most that many updates stale when it was requested (per-call staleness is still stamped on every model call);
  dropped groups and skipped steps adjust both sides (below);
- *eval* runs take priority: their groups are admitted first, ignore the lag bound, and carry priority 100;
- ``max_steps``: no train group is admitted for rollout step ``s >= max_steps`` (eval runs are not limited), so once
  the last step is admitted the inference engines are left to the evals.

**Step accounting under group selection** (the service's ``group_selection``, see ``rollout.selection``). A train
group's rollout step is ``(train_groups_admitted - dropped) // groups_per_step`` and the lag bound is
``s - skipped_steps - learner_version <= max_off_policy_steps``:

- ``refill`` (DAPO dynamic sampling): the service reports every dropped zero-signal train group
  (``group_dropped``); it stops counting toward its step, so a replacement is admitted for the same step and every
  step ends with ``groups_per_step`` groups with signal;
- ``drop`` (Polar): dropped groups still count (a step is exactly ``groups_per_step`` admitted groups, and the service
  batches each step's kept groups once all of them have completed); a step whose groups were *all* dropped yields no
  batch and no learner version, so the service reports it (``step_skipped``) and the lag bound stops waiting for it
  (``s - skipped`` is the index of the batch the new group will land in);
- ``off``: nothing is reported.

Why this always progresses (the learner makes one version per batch it takes, even one with nothing left to train
or one it rejects: ``learner.train``; every admitted group ends, at the latest by its deadline): suppose nothing is
in flight and admission is blocked at step ``s``.
``drop``: the lag test of a step only gets looser over time (the version and the skipped count only grow), so a step
that admitted one group admits all of its groups; hence every step below ``s`` was fully admitted and has completed,
and each became either a batch (a version, once trained) or a skipped step: ``learner_version + skipped = s``, lag 0.
``refill``/``off``: the ``K = admitted - dropped`` groups all completed and were kept, so ``K // groups_per_batch``
batches come, i.e. ``learner_version >= K // groups_per_step = s`` when ``groups_per_batch <= groups_per_step``, lag
<= 0. The settings refuse ``groups_per_batch > groups_per_step`` (in any mode the buffer would then eventually wait
for groups that the lag bound never admits). Without the reports (the behaviour before ``group_selection``), each
dropped group kept counting toward its step while the buffer waited for a kept one: a run stalled for good once the
drops left the buffer short of a batch at the lag bound (one drop with ``max_off_policy_steps=0``, at most
``(max_off_policy_steps + 1) * groups_per_step``; ``tests/test_selection.py`` replays it).
The reported counts are rebuilt after a restart from what the service re-derives from the topics (a dropped group is
dropped again when its events are replayed, before the first tick); a missing report only makes admission stricter.

**Periodic eval** (``RunSpec.every_steps = N``): pass ``r`` of an eval run (its ``r``-th round over its tasks) is
admitted once ``learner_version >= r * N`` (plus the skipped steps under ``drop``, which never get a version: without
them the round after the last step would wait forever); pass 0 runs at once, so ``epochs = max_steps / N + 1``
evaluates before the first step and after the last. ``epochs`` is the number of rounds (without it, rounds go on as
long as versions come). A round admitted late (the learner ran ahead) shows it in the weight versions that served
its calls. Every request of an eval run carries ``metadata["eval_round"]`` (and, when periodic, ``eval_at_version``
= ``r * N``); the admitted count is rebuilt from ``group_index`` as for every run.

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
    epochs: int | None = None  # None: cycle forever (train); eval runs default to one pass (periodic: forever)
    shuffle_seed: int | None = 0
    every_steps: int | None = None  # eval only: pass r waits for learner version r * every_steps

    def __post_init__(self) -> None:
        if not self.task_ids:
            raise ValueError(f"run {self.name!r} has no tasks")
        if self.group_size < 1:
            raise ValueError("group_size must be >= 1")
        if self.every_steps is not None:
            if self.kind is not SessionKind.EVAL:
                raise ValueError(f"run {self.name!r}: every_steps is for eval runs only")
            if self.every_steps < 1:
                raise ValueError(f"run {self.name!r}: every_steps must be >= 1")

    @property
    def passes(self) -> int | None:
        """How many passes over the tasks (None: forever). Eval runs default to one, periodic ones to forever."""
        if self.epochs is not None:
            return self.epochs
        return 1 if self.kind is SessionKind.EVAL and self.every_steps is None else None

    def pass_of(self, n: int) -> int:
        """The pass (eval: round) the run's n-th group belongs to."""
        return n // len(self.task_ids)

    def task_for(self, n: int) -> str | None:
        """The task of this run's n-th group, or None when the run is exhausted."""
        epochs = self.passes
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
    max_steps: int | None = None  # no train group for rollout step >= max_steps (None: train forever)


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
    # Sessions whose SessionFinished we have seen: the only end that counts. A terminal SessionStateChanged does not
    # end a session: a node can publish DONE and die before its SessionFinished transaction commits, and a group
    # waiting on that session must still reach its deadline, be cancelled and be closed by us.
    ended: set[str] = field(default_factory=set)
    task_id: str = ""
    task_source: str = ""
    harness: str = ""
    template: SessionRequested | None = None  # the first request seen: how to re-publish a missing member

    def open_sessions(self) -> list[str]:
        return sorted(s for s in self.sessions if s not in self.ended)

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
        # Reported by the service (see the module docstring): train groups dropped for a replacement (refill, by
        # train_index) and steps whose groups were all dropped (drop). Sets, so a report repeated after a rebuild
        # counts once.
        self.dropped: set[int] = set()
        self.skipped_steps: set[int] = set()
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
            if group is not None and event.session_id not in group.ended:  # the first end wins, as downstream
                self._set_state(group, event.session_id, event.status)
                group.ended.add(event.session_id)
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

    def group_dropped(self, train_index: int) -> None:
        """refill: the train group admitted as ``train_index`` was dropped (zero signal); admit a replacement."""
        if train_index >= 0:
            self.dropped.add(train_index)

    def step_skipped(self, step: int) -> None:
        """drop: every group of rollout step ``step`` was dropped, so no batch (and no learner version) comes for it."""
        self.skipped_steps.add(step)

    @property
    def next_step(self) -> int:
        """The rollout step of the next train group (dropped groups do not count toward a step)."""
        return (self.train_groups_admitted - len(self.dropped)) // self.config.groups_per_step

    @property
    def steps_done(self) -> int:
        """Steps the learner is past: its version (one per batch) plus the skipped steps, which make no version."""
        return self.learner_version + len(self.skipped_steps)

    @property
    def train_done(self) -> bool:
        """``max_steps`` reached: no train group will be admitted any more."""
        return self.config.max_steps is not None and self.next_step >= self.config.max_steps

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
        step = self.next_step
        for run in runs:
            n = self.admitted[run.name]
            task = run.task_for(n)
            if task is None:
                continue
            if run.kind is SessionKind.EVAL:
                if run.every_steps is not None and self.steps_done < run.pass_of(n) * run.every_steps:
                    continue  # this round waits for its version; eval runs keep their priority once it is there
            elif self.train_done:
                continue
            elif step - self.steps_done > self.config.max_off_policy_steps:
                self.counters["admission_blocked_by_lag"] += 1
                continue
            return self._requests(run, n, task, step, now_ms)
        return []

    def _requests(self, run: RunSpec, n: int, task: str, step: int, now_ms: int) -> list[Event]:
        group_id = f"{run.name}-{n:06d}"
        meta = {"group_size": str(run.group_size), "run": run.name, "group_index": str(n)}
        if run.kind is SessionKind.TRAIN:
            meta["train_index"] = str(self.train_groups_admitted)
        else:
            meta["eval_round"] = str(run.pass_of(n))
            if run.every_steps is not None:
                meta["eval_at_version"] = str(run.pass_of(n) * run.every_steps)
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
            "train_groups_dropped": len(self.dropped),
            "steps_skipped": sorted(self.skipped_steps),
            "next_step": self.next_step,
            "steps_done": self.steps_done,
            "max_steps": self.config.max_steps,
            "train_done": self.train_done,
            "sessions_by_state": {k: v for k, v in sorted(self.states.items()) if v},
            "counters": dict(sorted(self.counters.items())),
            "runs": {name: self._run_snapshot(run) for name, run in sorted(self.runs.items())},
        }

    def _run_snapshot(self, run: RunSpec) -> dict[str, object]:
        out: dict[str, object] = {"groups_admitted": self.admitted[run.name]}
        if run.kind is SessionKind.EVAL:
            # Rounds admitted so far (the last one possibly partly).
            out["rounds_started"] = -(-self.admitted[run.name] // len(run.task_ids))
        return out
