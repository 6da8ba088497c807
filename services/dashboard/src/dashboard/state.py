"""The dashboard's view of a run, folded from the events on the topics. Pure: no I/O, no clock.

Everything shown is derived from the wire contract, so the dashboard needs no service to expose internals and can be
rebuilt by replaying the topics from the beginning:

- sessions by state and READY depth: the latest ``SessionStateChanged`` per session (highest ``seq`` wins, so
  redelivered or reordered events do not move a session backwards);
- reward per step, chain breaks and trainable-token fraction per harness: the rows of each ``TrajectoryBatch``
  (a session whose calls rebuilt into k traces had k - 1 chain breaks);
- learner loss and throughput, weight version: ``WeightsPublished.metrics``;
- staleness: for each ``ModelCallRecorded``, the newest version *published before the call started* minus the version
  that served it (by event time, so the order in which topics are consumed does not change the answer); an attempt
  that a retry superseded (``supersedes_call_ids``) is not counted: the harness never got it;
- recent sessions with their calls: ``ModelCallRecorded`` + ``SessionFinished`` + ``RewardPublished``;
- group selection: zero-signal groups left out of batches, from each batch's ``metrics``
  (``groups.dropped_zero_signal``, ``groups.dropped_zero_signal_total``, ``steps.skipped_total``; the rollout's
  ``/state`` also counts the drops since its last batch);
- eval rounds: eval ``SessionRequested`` (``metadata["eval_round"]``, ``eval_at_version``) joined by session id with
  ``RewardPublished`` (solved = ``resolved``; ``error`` outcomes are infrastructure, left out like the trainer masks
  them) and the weight versions of the session's ``ModelCallRecorded``.

Topics are read in no particular order, so a reward or a call may come before its request: facts of sessions whose
request is not in yet wait in a bounded buffer (``max_early``), and known train sessions are remembered (bounded too)
so that their later events are not buffered. Memory is bounded: only the most recent ``max_sessions`` sessions keep
their calls; eval sessions are kept whole (a few per eval task and round).
"""

from __future__ import annotations

import bisect
import itertools
from collections import Counter, OrderedDict, defaultdict
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from contracts import (
    Event,
    ModelCallRecorded,
    Outcome,
    RewardPublished,
    SessionFinished,
    SessionKind,
    SessionRequested,
    SessionState,
    SessionStateChanged,
    TrajectoryBatch,
    WeightsPublished,
)

__all__ = ["DashboardState"]


@dataclass
class _Session:
    session_id: str
    group_id: str = ""
    harness: str = ""
    task_id: str = ""
    state: str = SessionState.REQUESTED.value
    seq: int = -1
    reason: str | None = None
    reward: float | None = None
    outcome: str | None = None
    calls: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class _Facts:
    """What an eval round needs of one session."""

    run: str = ""
    round: int = 0
    at_version: int | None = None
    reward: float | None = None
    resolved: bool = False
    error: bool = False
    min_version: int | None = None
    max_version: int | None = None


@dataclass
class _HarnessStats:
    sessions: int = 0
    traces: int = 0
    tokens: int = 0
    trainable: int = 0


class DashboardState:
    def __init__(self, max_sessions: int = 200, max_early: int = 20_000) -> None:
        self.max_sessions = max_sessions
        self.max_early = max_early
        self._eval: dict[str, _Facts] = {}
        self._early: OrderedDict[str, _Facts] = OrderedDict()  # request not seen yet: eval or train unknown
        self._train: OrderedDict[str, None] = OrderedDict()  # known train sessions, bounded like the buffer
        self._batch_ids: set[str] = set()
        self._selection: dict[int, dict[str, float]] = {}  # batch step -> groups, dropped
        self._dropped_total = 0.0
        self._skipped_total = 0.0
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._state_counts: Counter[str] = Counter()
        self._steps: dict[int, dict[str, float]] = {}
        self._weights: list[dict[str, Any]] = []
        # (started_at, weight_version, call_id) of the calls the harnesses got, bounded below
        self._call_versions: list[tuple[int, int, str]] = []
        self._published: list[tuple[int, int]] = []  # (published_at, version)
        self._harness: defaultdict[str, _HarnessStats] = defaultdict(_HarnessStats)
        self._rewards: list[float] = []
        self.latest_version = 0
        self.events_seen = 0

    # ------------------------------------------------------------------------------------------------- folding

    def apply(self, event: Event) -> None:
        self.events_seen += 1
        if isinstance(event, SessionStateChanged):
            self._on_state(event)
        elif isinstance(event, ModelCallRecorded):
            self._on_call(event)
        elif isinstance(event, SessionFinished):
            s = self._session(event.session_id)
            s.group_id, s.harness, s.task_id = event.group_id, event.harness, event.task_id
            s.reason = event.reason or s.reason
        elif isinstance(event, RewardPublished):
            s = self._session(event.session_id)
            s.reward, s.outcome = event.reward, event.outcome.value
            self._rewards.append(event.reward)
            facts = self._facts(event.session_id)
            if facts is not None and facts.reward is None:
                facts.reward, facts.resolved = event.reward, event.resolved
                facts.error = event.outcome is Outcome.ERROR
        elif isinstance(event, SessionRequested):
            self._on_request(event)
        elif isinstance(event, TrajectoryBatch):
            self._on_batch(event)
        elif isinstance(event, WeightsPublished):
            self.latest_version = max(self.latest_version, event.version)
            bisect.insort(self._published, (event.published_at, event.version))
            self._weights.append({"version": event.version, "step": event.step, **event.metrics})

    def _facts(self, session_id: str) -> _Facts | None:
        """Where an event of this session goes for the eval rounds (None: a train session)."""
        facts = self._eval.get(session_id)
        if facts is not None or session_id in self._train:
            return facts
        facts = self._early.get(session_id)
        if facts is None:
            facts = self._early[session_id] = _Facts()
            while len(self._early) > self.max_early:
                self._early.popitem(last=False)
        return facts

    def _on_request(self, event: SessionRequested) -> None:
        early = self._early.pop(event.session_id, None)
        if event.kind is not SessionKind.EVAL:
            self._train[event.session_id] = None
            while len(self._train) > self.max_early:
                self._train.popitem(last=False)
            return
        if event.session_id in self._eval:
            return  # redelivered
        facts = self._eval[event.session_id] = early or _Facts()
        raw_round, at = event.metadata.get("eval_round", "0"), event.metadata.get("eval_at_version", "")
        facts.run = event.metadata.get("run", "")
        facts.round = int(raw_round) if raw_round.isdigit() else 0
        facts.at_version = int(at) if at.isdigit() else None

    def _session(self, session_id: str) -> _Session:
        s = self._sessions.get(session_id)
        if s is None:
            s = self._sessions[session_id] = _Session(session_id)
            self._state_counts[s.state] += 1
            while len(self._sessions) > self.max_sessions:
                _, old = self._sessions.popitem(last=False)
                self._state_counts[old.state] -= 1
        return s

    def _on_state(self, event: SessionStateChanged) -> None:
        s = self._session(event.session_id)
        if event.seq <= s.seq:
            return  # duplicate or out of order: the newer state already counts
        self._state_counts[s.state] -= 1
        s.state, s.seq, s.group_id = event.state.value, event.seq, event.group_id
        s.reason = event.reason or s.reason
        self._state_counts[s.state] += 1

    def _on_call(self, event: ModelCallRecorded) -> None:
        s = self._session(event.session_id)
        if any(c["call_id"] == event.call_id or event.call_id in c["supersedes"] for c in s.calls):
            return  # redelivered, or an attempt whose record landed after the call that replaced it
        # An attempt the gateway could not record durably, listed before the call asked again arrived: the session's
        # calls are the ones the harness got, as the rollout reads them (ModelCallRecorded.supersedes_call_ids).
        if event.supersedes_call_ids:
            gone = set(event.supersedes_call_ids)
            s.calls[:] = [c for c in s.calls if c["call_id"] not in gone]
            self._call_versions[:] = [cv for cv in self._call_versions if cv[2] not in gone]
        self._call_versions.append((event.started_at, event.weight_version, event.call_id))
        del self._call_versions[: -self.max_sessions * 50]
        facts = self._facts(event.session_id)
        if facts is not None:
            v = event.weight_version
            facts.min_version = v if facts.min_version is None else min(facts.min_version, v)
            facts.max_version = v if facts.max_version is None else max(facts.max_version, v)
        s.calls.append(
            {
                "call_id": event.call_id,
                "index": event.call_index,
                "protocol": event.protocol.value,
                "mode": event.tokenization.value,
                "prompt_len": event.prompt_len,
                "completion_len": len(event.completion_token_ids),
                "finish": event.finish_reason,
                "weight_version": event.weight_version,
                "ttft_ms": round(event.timings.ttft_ms, 1),
                "total_ms": round(event.timings.total_ms, 1),
                "supersedes": list(event.supersedes_call_ids),
            }
        )
        s.calls.sort(key=lambda c: int(c["index"]))

    def _on_batch(self, event: TrajectoryBatch) -> None:
        if event.batch_id in self._batch_ids:
            return
        self._batch_ids.add(event.batch_id)
        m = event.metrics
        dropped = m.get("groups.dropped_zero_signal", 0.0)
        self._selection[event.step] = {"groups": float(event.num_groups), "dropped": dropped}
        # The per-batch counts sum to the rollout's running total; the total alone also covers a batch not seen.
        self._dropped_total = max(self._dropped_total + dropped, m.get("groups.dropped_zero_signal_total", 0.0))
        self._skipped_total = max(self._skipped_total, m.get("steps.skipped_total", 0.0))
        if event.arrow_ipc is None:
            return  # claim-checked batches are summarised by their metrics only
        from contracts import read_ipc

        table = read_ipc(event.arrow_ipc)
        if table.num_rows == 0:
            return
        per_session: dict[str, float] = {}
        for sid, reward in zip(table.column("session_id").to_pylist(), table.column("reward").to_pylist(), strict=True):
            per_session[sid] = float(reward)
        step = self._steps.setdefault(event.step, {"sessions": 0.0, "reward_sum": 0.0})
        step["sessions"] += len(per_session)
        step["reward_sum"] += sum(per_session.values())
        for harness in set(table.column("harness").to_pylist()):
            rows = table.filter(pc.equal(table.column("harness"), harness))
            stats = self._harness[str(harness)]
            stats.sessions += len(set(rows.column("session_id").to_pylist()))
            stats.traces += rows.num_rows
            stats.tokens += int(pc.sum(pc.list_value_length(rows.column("tokens"))).as_py() or 0)
            stats.trainable += int(pc.sum(pc.list_flatten(rows.column("loss_mask")).cast(pa.int64())).as_py() or 0)

    # ------------------------------------------------------------------------------------------------ snapshot

    def snapshot(self, recent: int = 20) -> dict[str, Any]:
        steps = [
            {"step": k, "sessions": int(v["sessions"]), "reward_mean": v["reward_sum"] / max(1.0, v["sessions"])}
            for k, v in sorted(self._steps.items())
        ]
        harness = {
            name: {
                "sessions": st.sessions,
                "traces": st.traces,
                "chain_breaks_per_session": (st.traces - st.sessions) / st.sessions if st.sessions else 0.0,
                "trainable_fraction": st.trainable / st.tokens if st.tokens else 0.0,
            }
            for name, st in sorted(self._harness.items())
        }
        sessions = [
            {
                "session_id": s.session_id,
                "group_id": s.group_id,
                "harness": s.harness,
                "task_id": s.task_id,
                "state": s.state,
                "reason": s.reason,
                "reward": s.reward,
                "outcome": s.outcome,
                "calls": s.calls,
            }
            for s in list(self._sessions.values())[-recent:][::-1]
        ]
        staleness: Counter[int] = Counter()
        running_max: list[int] = list(itertools.accumulate((v for _, v in self._published), max))
        for started_at, version, _ in self._call_versions:
            i = bisect.bisect_right(self._published, (started_at, 1 << 62))
            newest = running_max[i - 1] if i else 0
            staleness[max(0, newest - version)] += 1
        return {
            "eval_rounds": self._eval_rounds(),
            "selection": {
                "groups_dropped_zero_signal": int(self._dropped_total),
                "steps_skipped": int(self._skipped_total),
                "per_batch": [
                    {"step": k, "groups": int(v["groups"]), "dropped": int(v["dropped"])}
                    for k, v in sorted(self._selection.items())[-200:]
                ],
            },
            "sessions_by_state": {st.value: max(0, self._state_counts[st.value]) for st in SessionState},
            "ready_depth": max(0, self._state_counts[SessionState.READY.value]),
            "reward_per_step": steps,
            "rewards_seen": len(self._rewards),
            "reward_mean_recent": sum(self._rewards[-32:]) / len(self._rewards[-32:]) if self._rewards else None,
            "learner": self._weights[-200:],
            "weight_version": self.latest_version,
            "staleness": {str(k): v for k, v in sorted(staleness.items())},
            "harness": harness,
            "recent_sessions": sessions,
            "events_seen": self.events_seen,
        }

    def _eval_rounds(self) -> list[dict[str, Any]]:
        rounds: dict[tuple[str, int], list[_Facts]] = defaultdict(list)
        for f in self._eval.values():
            rounds[(f.run, f.round)].append(f)
        out = []
        for (run, n), facts in sorted(rounds.items()):
            scored = [f for f in facts if f.reward is not None and not f.error]
            versions = [v for f in facts for v in (f.min_version, f.max_version) if v is not None]
            out.append(
                {
                    "run": run,
                    "round": n,
                    "at_version": next((f.at_version for f in facts if f.at_version is not None), None),
                    "sessions": len(facts),
                    "scored": len(scored),
                    "mean_reward": sum(f.reward or 0.0 for f in scored) / len(scored) if scored else None,
                    "solved_fraction": sum(f.resolved for f in scored) / len(scored) if scored else None,
                    "min_weight_version": min(versions) if versions else None,
                    "max_weight_version": max(versions) if versions else None,
                }
            )
        return out
