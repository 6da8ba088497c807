"""What the rollout service exposes for the dashboard: one state object, rendered as JSON (``GET /state``) and as
Prometheus metrics (``GET /metrics``).

- sessions by state (from ``SessionStateChanged`` / ``SessionFinished``), READY and RUNNING depth;
- groups waiting in the assembler, groups in flight in the scheduler;
- staleness: for every model call of an emitted group, ``learner_version - call.weight_version`` (histogram);
- chain breaks (and chains, calls) per harness; trainable vs masked tokens;
- groups kept / dropped as zero-signal (``group_selection``), steps skipped, sessions masked by reason, batches;
- eval: the aggregate, and per eval round (``SessionRequested.metadata["eval_round"]``): sessions, mean reward,
  solved fraction and the weight versions that served the round (a round admitted late shows a newer version).

Counts survive neither a restart nor the state rebuild, except where they are re-derived from the rebuilt state
(dropped groups, skipped steps, eval rounds: a group is counted once per process, however often it is re-taken).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, Histogram
from prometheus_client import Counter as PCounter

from contracts import TERMINAL_STATES, SessionFinished, SessionState, SessionStateChanged
from rollout.groups import GroupResult

__all__ = ["STALENESS_BUCKETS", "RolloutMetrics"]

STALENESS_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 16, 32)


class RolloutMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self._sessions_state = Gauge("floe_rollout_sessions", "live sessions by state", ["state"], registry=r)
        self._ended = PCounter("floe_rollout_sessions_ended", "sessions that ended, by state", ["state"], registry=r)
        self._groups_waiting = Gauge("floe_rollout_groups_waiting", "groups waiting in the assembler", registry=r)
        self._groups_in_flight = Gauge("floe_rollout_groups_in_flight", "groups admitted, not ended", registry=r)
        self._staleness = Histogram(
            "floe_rollout_call_staleness",
            "learner version minus serving version per model call",
            buckets=STALENESS_BUCKETS,
            registry=r,
        )
        self._chains = PCounter("floe_rollout_chains", "traces built, by harness", ["harness"], registry=r)
        self._breaks = PCounter(
            "floe_rollout_chain_breaks", "chain check failures, by harness", ["harness"], registry=r
        )
        self._calls = PCounter("floe_rollout_calls", "model calls reconstructed, by harness", ["harness"], registry=r)
        self._tokens = PCounter("floe_rollout_tokens", "tokens in emitted traces", ["kind"], registry=r)
        self._groups = PCounter("floe_rollout_groups", "groups assembled, by outcome", ["outcome"], registry=r)
        self._masked = PCounter("floe_rollout_sessions_masked", "masked sessions, by reason", ["reason"], registry=r)
        self._batches = PCounter("floe_rollout_batches", "trajectory batches published", ["transport"], registry=r)
        self.live: dict[str, SessionState] = {}
        self._ended_ids: set[str] = set()
        self.ended: Counter[str] = Counter()
        self.staleness: Counter[int] = Counter()
        self.per_harness: dict[str, Counter[str]] = {}
        self.tokens: Counter[str] = Counter()
        self.groups: Counter[str] = Counter()
        self.masked: Counter[str] = Counter()
        self.batches: Counter[str] = Counter()
        self.eval: dict[str, float] = {"sessions": 0, "masked": 0, "reward_sum": 0.0}
        self._eval = PCounter("floe_rollout_eval", "eval groups assembled (not trained on)", ["what"], registry=r)
        self.eval_rounds: dict[tuple[str, int], _EvalRound] = {}
        self._eval_round_reward = Gauge(
            "floe_rollout_eval_round_reward", "mean eval reward per round", ["run", "round"], registry=r
        )
        self._eval_round_solved = Gauge(
            "floe_rollout_eval_round_solved", "solved fraction of an eval round", ["run", "round"], registry=r
        )
        self._dropped = Gauge(
            "floe_rollout_groups_dropped_zero_signal", "zero-signal train groups left out of batches", registry=r
        )
        self._skipped = Gauge("floe_rollout_steps_skipped", "steps whose groups were all dropped", registry=r)
        self.groups_dropped_zero_signal = 0
        self.steps_skipped = 0
        self._seen_groups: set[str] = set()  # a group re-taken after a rebuild in the same process counts once
        self.groups_waiting = 0
        self.groups_in_flight = 0
        self.learner_version = 0
        self.last_step = -1

    # ------------------------------------------------------------------------------------------------ updates
    def observe_session(self, event: SessionStateChanged | SessionFinished) -> None:
        state = event.state if isinstance(event, SessionStateChanged) else event.status
        if event.session_id in self._ended_ids:
            return
        if state in TERMINAL_STATES:
            self.live.pop(event.session_id, None)
            if isinstance(event, SessionFinished):
                self._ended_ids.add(event.session_id)
                self.ended[state.value] += 1
                self._ended.labels(state.value).inc()
        else:
            self.live[event.session_id] = state
        by_state = Counter(s.value for s in self.live.values())
        for s in SessionState:
            if s not in TERMINAL_STATES:
                self._sessions_state.labels(s.value).set(by_state.get(s.value, 0))

    def observe_group(self, group: GroupResult, emitted: bool) -> None:
        """A train group, kept for a batch (``emitted``) or dropped as zero-signal."""
        if group.group_id in self._seen_groups:
            return
        self._seen_groups.add(group.group_id)
        outcome = "emitted" if emitted else "dropped_zero_signal"
        self.groups[outcome] += 1
        self._groups.labels(outcome).inc()
        if group.zero_signal:
            self.groups["zero_signal"] += 1
            self._groups.labels("zero_signal").inc()
        for s in group.sessions:
            h = self.per_harness.setdefault(s.harness, Counter())
            h["calls"] += s.stats.calls
            h["chains"] += s.stats.chains
            h["breaks"] += s.stats.breaks
            self._calls.labels(s.harness).inc(s.stats.calls)
            self._chains.labels(s.harness).inc(s.stats.chains)
            self._breaks.labels(s.harness).inc(s.stats.breaks)
            if not s.trainable:
                reason = (s.rows[0].masked_reason or "masked").split(":")[0]
                self.masked[reason] += 1
                self._masked.labels(reason).inc()
            for row in s.rows:
                trainable = sum(row.loss_mask)
                masked = len(row.tokens) - trainable
                self.tokens["trainable"] += trainable
                self.tokens["masked"] += masked
                self._tokens.labels("trainable").inc(trainable)
                self._tokens.labels("masked").inc(masked)
        for s in group.sessions:
            for version in {v for row in s.rows for v in row.weight_versions if v >= 0}:
                lag = max(0, self.learner_version - version)
                self.staleness[lag] += 1
                self._staleness.observe(lag)

    def observe_eval(self, group: GroupResult) -> None:
        """Eval groups: reward mean over their sessions (masked sessions excluded), not trained on."""
        if group.group_id in self._seen_groups:
            return
        self._seen_groups.add(group.group_id)
        run = group.metadata.get("run", "")
        raw_round = group.metadata.get("eval_round", "0")
        key = (run, int(raw_round) if raw_round.isdigit() else 0)
        rnd = self.eval_rounds.get(key)
        if rnd is None:
            at = group.metadata.get("eval_at_version", "")
            rnd = self.eval_rounds[key] = _EvalRound(at_version=int(at) if at.isdigit() else None)
        rnd.groups += 1
        for s in group.sessions:
            if s.trainable:
                self.eval["sessions"] += 1
                self.eval["reward_sum"] += float(s.rows[0].reward)
                rnd.sessions += 1
                rnd.reward_sum += float(s.rows[0].reward)
                rnd.solved += s.resolved
                for v in {v for row in s.rows for v in row.weight_versions if v >= 0}:
                    rnd.min_version = v if rnd.min_version is None else min(rnd.min_version, v)
                    rnd.max_version = v if rnd.max_version is None else max(rnd.max_version, v)
            else:
                self.eval["masked"] += 1
                rnd.masked += 1
        self._eval.labels("groups").inc()
        if rnd.sessions:
            self._eval_round_reward.labels(run, str(key[1])).set(rnd.reward_sum / rnd.sessions)
            self._eval_round_solved.labels(run, str(key[1])).set(rnd.solved / rnd.sessions)

    def set_selection(self, dropped: int, skipped_steps: int) -> None:
        """Totals from the group selector (re-derived from the topics after a restart, unlike the counters)."""
        self.groups_dropped_zero_signal = dropped
        self.steps_skipped = skipped_steps
        self._dropped.set(dropped)
        self._skipped.set(skipped_steps)

    def observe_batch(self, inline: bool, step: int) -> None:
        transport = "inline" if inline else "claim_check"
        self.batches[transport] += 1
        self._batches.labels(transport).inc()
        self.last_step = max(self.last_step, step)

    def set_depths(self, groups_waiting: int, groups_in_flight: int, learner_version: int) -> None:
        self.groups_waiting = groups_waiting
        self.groups_in_flight = groups_in_flight
        self.learner_version = learner_version
        self._groups_waiting.set(groups_waiting)
        self._groups_in_flight.set(groups_in_flight)

    # ------------------------------------------------------------------------------------------------ views
    def snapshot(self) -> dict[str, Any]:
        by_state = Counter(s.value for s in self.live.values())
        return {
            "sessions_by_state": dict(sorted(by_state.items())),
            "sessions_ended": dict(sorted(self.ended.items())),
            "ready_depth": by_state.get(SessionState.READY.value, 0),
            "in_flight_depth": sum(by_state.values()),
            "groups_waiting": self.groups_waiting,
            "groups_in_flight": self.groups_in_flight,
            "learner_version": self.learner_version,
            "last_step": self.last_step,
            "staleness_histogram": {str(k): v for k, v in sorted(self.staleness.items())},
            "chains_by_harness": {h: dict(c) for h, c in sorted(self.per_harness.items())},
            "tokens": dict(self.tokens),
            "groups": dict(self.groups),
            "groups_dropped_zero_signal": self.groups_dropped_zero_signal,
            "steps_skipped": self.steps_skipped,
            "sessions_masked": dict(self.masked),
            "batches": dict(self.batches),
            "eval": {
                **dict(self.eval),
                "mean_reward": self.eval["reward_sum"] / self.eval["sessions"] if self.eval["sessions"] else None,
            },
            "eval_rounds": [rnd.view(run, n) for (run, n), rnd in sorted(self.eval_rounds.items())],
        }


@dataclass
class _EvalRound:
    at_version: int | None = None  # the version the round waited for (periodic eval runs)
    groups: int = 0
    sessions: int = 0  # trainable (scored) sessions: the ones the reward mean is over
    masked: int = 0
    reward_sum: float = 0.0
    solved: int = 0
    min_version: int | None = None
    max_version: int | None = None

    def view(self, run: str, n: int) -> dict[str, Any]:
        return {
            "run": run,
            "round": n,
            "at_version": self.at_version,
            "groups": self.groups,
            "sessions": self.sessions,
            "masked": self.masked,
            "mean_reward": self.reward_sum / self.sessions if self.sessions else None,
            "solved_fraction": self.solved / self.sessions if self.sessions else None,
            "min_weight_version": self.min_version,
            "max_weight_version": self.max_version,
        }
