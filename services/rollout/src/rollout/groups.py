"""Join a session's calls, end and reward, wait for whole GRPO groups, and turn each group into trajectory rows.

``GroupAssembler`` is pure state fed with events in any order (``add``); it never reads a clock or a broker, so the
live worker, the crash-recovery rebuild and ``replay-rebuild`` all run the same code over the same events.

A session is *complete* when its ``SessionFinished`` is in, its ``RewardPublished`` is in (only needed when the agent
finished, see ``advantages.needs_reward``) and at least ``SessionFinished.calls`` distinct model calls are in.
A group is *ready* when its size G is known (``SessionRequested.metadata["group_size"]``) and G sessions are
complete; ``ready_groups(force=True)`` also releases groups of unknown size whose known sessions are all complete
(used at the end of a replay). ``expire`` releases a session whose calls never all arrived, masked.

Rows are built per session in ``session_id`` order, so a group's rows depend only on the group's events.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from contracts import (
    AdvantageMethod,
    Event,
    ModelCallRecorded,
    RewardPublished,
    SessionFinished,
    SessionKind,
    SessionRequested,
    SessionState,
    TrajectoryRow,
    group_advantages,
)
from rollout.advantages import classify, needs_reward
from rollout.builders import build_trajectories
from rollout.calls import ReconstructionError, full_requests, merge_call
from rollout.trace import ReconstructionStats, Trace

__all__ = ["GroupAssembler", "GroupResult", "SessionRows", "group_size_of"]

GROUP_SIZE_KEY = "group_size"


def group_size_of(request: SessionRequested) -> int | None:
    raw = request.metadata.get(GROUP_SIZE_KEY)
    return int(raw) if raw and raw.isdigit() and int(raw) > 0 else None


@dataclass
class _Session:
    session_id: str
    group_id: str
    request: SessionRequested | None = None
    calls: dict[int, ModelCallRecorded] = field(default_factory=dict)
    conflict: str | None = None  # the first pair of records of one call_index that do not supersede each other
    finished: SessionFinished | None = None
    reward: RewardPublished | None = None
    expired: bool = False

    def complete(self) -> bool:
        f = self.finished
        if f is None:
            return False
        if needs_reward(f) and self.reward is None and not self.expired:
            return False
        return self.recorded(f.calls) >= f.calls or self.expired

    def recorded(self, expected: int) -> int:
        """How many of the calls ``0 .. expected - 1`` are in (``SessionFinished.calls`` is what the gateway node
        recorded: a record at or above it is an attempt it could not, see ``_build``)."""
        return sum(1 for index in self.calls if index < expected)


@dataclass(frozen=True)
class SessionRows:
    session_id: str
    harness: str
    rows: list[TrajectoryRow]
    extras: list[dict[str, Any]]  # per row: request_json, final_completion (for the Parquet dataset / SFT export)
    stats: ReconstructionStats
    trainable: bool
    resolved: bool = False  # the scorer's verdict (RewardPublished.resolved); eval reports the solved fraction


@dataclass(frozen=True)
class GroupResult:
    group_id: str
    sessions: list[SessionRows]
    zero_signal: bool
    trainable_sessions: int
    finished_at: int
    kind: str = "train"  # "eval" when the group's requests were eval runs: measured, never trained on
    # From the group's first known request: the scheduler's bookkeeping (run, train_index, eval_round, ...) and the
    # rollout step it was admitted for; group selection and the eval report read them.
    metadata: dict[str, str] = field(default_factory=dict)
    rollout_step: int = 0

    @property
    def rows(self) -> list[TrajectoryRow]:
        return [row for s in self.sessions for row in s.rows]

    @property
    def extras(self) -> list[dict[str, Any]]:
        return [e for s in self.sessions for e in s.extras]

    @property
    def stats(self) -> ReconstructionStats:
        total = ReconstructionStats()
        for s in self.sessions:
            total.add(s.stats)
        return total

    def weight_versions(self) -> tuple[int, int]:
        versions = [v for row in self.rows for v in row.weight_versions if v >= 0]
        return (min(versions), max(versions)) if versions else (0, 0)


class GroupAssembler:
    def __init__(
        self,
        builder: str = "prefix_merging",
        advantage: AdvantageMethod = "mean_std",
        eot_token_ids: Collection[int] | None = None,
    ) -> None:
        self.builder = builder
        self.advantage: AdvantageMethod = advantage
        self.eot_token_ids = frozenset(eot_token_ids) if eot_token_ids else None
        self._sessions: dict[str, _Session] = {}
        self._groups: dict[str, set[str]] = {}
        self._sizes: dict[str, int] = {}
        self.emitted: set[str] = set()  # groups already turned into rows: their late events are ignored
        self.emitted_sessions: set[str] = set()

    # ------------------------------------------------------------------------------------------------ intake
    def add(self, event: Event) -> str | None:
        """Record one event; returns the group it belongs to (None when ignored)."""
        if isinstance(event, SessionRequested):
            s = self._session(event.session_id, event.group_id)
            if s is None:
                return None
            s.request = event
            size = group_size_of(event)
            if size:
                self._sizes[event.group_id] = size
            return event.group_id
        if isinstance(event, SessionFinished | RewardPublished):
            s = self._session(event.session_id, event.group_id)
            if s is None:
                return None
            if isinstance(event, SessionFinished):
                s.finished = s.finished or event
            else:
                s.reward = s.reward or event
            return s.group_id
        if isinstance(event, ModelCallRecorded):
            if event.session_id in self.emitted_sessions:
                return None
            existing = self._sessions.get(event.session_id)
            group = existing.group_id if existing else ""
            if group in self.emitted:
                return None
            if existing is None:
                # Calls may arrive before the session's other events; the group is attached when they come.
                existing = _Session(event.session_id, "")
                self._sessions[event.session_id] = existing
            try:
                merge_call(existing.calls, event)
            except ReconstructionError as exc:
                existing.conflict = existing.conflict or str(exc)
            return existing.group_id or None
        return None

    def _session(self, session_id: str, group_id: str) -> _Session | None:
        if group_id in self.emitted or session_id in self.emitted_sessions:
            return None
        s = self._sessions.get(session_id)
        if s is None:
            s = self._sessions[session_id] = _Session(session_id, group_id)
        elif not s.group_id:
            s.group_id = group_id
        self._groups.setdefault(group_id, set()).add(session_id)
        return s

    # ------------------------------------------------------------------------------------------------ state
    def pending_sessions(self) -> int:
        return len(self._sessions)

    def groups_waiting(self) -> int:
        return len(self._groups)

    def group_of(self, session_id: str) -> str | None:
        s = self._sessions.get(session_id)
        return s.group_id if s and s.group_id else None

    def incomplete_sessions(self) -> list[str]:
        return sorted(sid for sid, s in self._sessions.items() if s.finished is not None and not s.complete())

    def expire(self, session_id: str) -> None:
        """Give up waiting for a finished session's missing calls or reward: it is released masked."""
        s = self._sessions.get(session_id)
        if s is not None and s.finished is not None:
            s.expired = True

    def close_open_sessions(self, reason: str) -> int:
        """End of input (replay): a session without ``SessionFinished`` is ended as ``CANCELLED`` with ``reason`` (so it
        is kept, masked), and every incomplete session is expired. Returns how many sessions were closed."""
        closed = 0
        for sid in sorted(self._sessions):
            s = self._sessions[sid]
            if s.finished is None:
                req = s.request
                self.add(
                    SessionFinished(
                        session_id=sid,
                        group_id=s.group_id or f"replay-{sid}",
                        task_id=req.task_id if req else "unknown",
                        harness=req.harness if req else "unknown",
                        node_id="replay",
                        status=SessionState.CANCELLED,
                        reason=reason,
                        calls=len(s.calls),
                        finished_at=max((c.started_at for c in s.calls.values()), default=0),
                    )
                )
                closed += 1
            s.expired = True
        return closed

    def ready_groups(self, force: bool = False) -> list[str]:
        ready = []
        for group_id, members in self._groups.items():
            size = self._sizes.get(group_id)
            complete = sum(1 for sid in members if self._sessions[sid].complete())
            if (size is not None and complete >= size) or (force and members and complete == len(members)):
                ready.append(group_id)
        return sorted(ready)

    # ------------------------------------------------------------------------------------------------ output
    def take(self, group_id: str) -> GroupResult:
        """Build the group's rows and forget its state (late duplicates are ignored from now on)."""
        members = sorted(self._groups.pop(group_id))
        sessions = [self._sessions.pop(sid) for sid in members]
        self._sizes.pop(group_id, None)
        self.emitted.add(group_id)
        self.emitted_sessions.update(members)
        return self._build(group_id, sessions)

    def mark_emitted(self, group_ids: Iterable[str], session_ids: Iterable[str] = ()) -> None:
        """Groups (and their sessions) known from the output topic to be published already: drop and ignore them."""
        self.emitted_sessions.update(session_ids)
        for sid in self.emitted_sessions:
            self._sessions.pop(sid, None)
        for group_id in group_ids:
            self.emitted.add(group_id)
            for sid in self._groups.pop(group_id, set()):
                self._sessions.pop(sid, None)
                self.emitted_sessions.add(sid)
            self._sizes.pop(group_id, None)

    def _build(self, group_id: str, sessions: list[_Session]) -> GroupResult:
        built: list[tuple[_Session, list[Trace], ReconstructionStats, bool, float, str | None, str]] = []
        for s in sessions:
            f = s.finished
            assert f is not None, "take() is only called on complete groups"
            outcome = classify(f, s.reward)
            trainable, reason = outcome.trainable, outcome.masked_reason
            traces: list[Trace] = []
            stats = ReconstructionStats()
            calls = list(s.calls.values())
            if trainable:
                # The gateway node that ended a trainable session counted the calls it recorded (indices 0 .. calls-1).
                # A record at or above that is an attempt it could not record durably that landed anyway and that no
                # later call superseded (the harness gave up on it): an answer the harness never got.
                calls = [c for c in calls if c.call_index < f.calls]
            try:
                if s.conflict is not None:
                    raise ReconstructionError(s.conflict)
                result = build_trajectories(calls, self.builder, self.eot_token_ids)
                traces, stats = list(result.traces), result.stats
            except ReconstructionError as exc:
                trainable, reason = False, f"reconstruction_error: {exc}"
            recorded = s.recorded(f.calls)
            if recorded < f.calls and reason is None:
                trainable, reason = False, f"calls_missing: {recorded} of {f.calls}"
            if not traces and reason is None:
                trainable, reason = False, "no_model_calls"
            built.append((s, traces, stats, trainable, outcome.reward, reason, outcome.status))
        adv = group_advantages([b[4] for b in built], [b[3] for b in built], self.advantage)
        out: list[SessionRows] = []
        for (s, traces, stats, trainable, reward, reason, status), advantage in zip(built, adv.advantages, strict=True):
            f = s.finished
            assert f is not None
            out.append(self._rows(s, f, traces, stats, trainable, reward, advantage, reason, status))
        request = next((s.request for s in sessions if s.request is not None), None)
        return GroupResult(
            group_id=group_id,
            sessions=out,
            zero_signal=adv.zero_signal,
            trainable_sessions=adv.trainable,
            finished_at=max(s.finished.finished_at for s in sessions if s.finished is not None),
            kind="eval" if any(s.request and s.request.kind is SessionKind.EVAL for s in sessions) else "train",
            metadata=dict(request.metadata) if request is not None else {},
            rollout_step=request.rollout_step if request is not None else 0,
        )

    def _rows(
        self,
        s: _Session,
        f: SessionFinished,
        traces: list[Trace],
        stats: ReconstructionStats,
        trainable: bool,
        reward: float,
        advantage: float,
        reason: str | None,
        status: str,
    ) -> SessionRows:
        # A session without traces still gets one empty placeholder row so the group stays aligned.
        items: list[Trace | None] = list(traces) or [None]
        rows: list[TrajectoryRow] = []
        extras: list[dict[str, Any]] = []
        try:
            requests = full_requests(s.calls.values())
        except ReconstructionError:
            requests = {}  # the dataset export counts the row as skipped_no_request; training is unaffected
        for i, trace in enumerate(items):
            tokens = trace.tokens if trace else ()
            if trace is not None and trainable:
                loss_mask, logprobs, versions = trace.loss_mask, trace.logprobs, trace.weight_versions
            else:
                loss_mask, logprobs, versions = (0,) * len(tokens), (0.0,) * len(tokens), (-1,) * len(tokens)
            rows.append(
                TrajectoryRow(
                    session_id=s.session_id,
                    group_id=s.group_id,
                    task_id=f.task_id,
                    harness=f.harness,
                    builder=self.builder,
                    trace_index=i,
                    num_traces=len(items),
                    prompt_len=trace.prompt_len if trace else 0,
                    tokens=tokens,
                    loss_mask=loss_mask,
                    logprobs=logprobs,
                    weight_versions=versions,
                    reward=reward,
                    advantage=advantage if trainable else 0.0,
                    session_weight=1.0 / len(items),
                    status=status,
                    masked_reason=None if trainable else reason,
                )
            )
            last = s.calls.get(trace.call_indices[-1]) if trace else None
            request = requests.get(last.call_index) if last else None
            extras.append(
                {
                    "request_json": json.dumps(request, sort_keys=True) if request else None,
                    "final_completion": list(last.completion_token_ids) if last else [],
                }
            )
        resolved = bool(s.reward is not None and s.reward.resolved)
        return SessionRows(s.session_id, f.harness, rows, extras, stats, trainable, resolved)
