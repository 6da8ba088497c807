"""What the rollout service exposes for the dashboard: one state object, rendered as JSON (``GET /state``) and as
Prometheus metrics (``GET /metrics``).

- sessions by state (from ``SessionStateChanged`` / ``SessionFinished``), READY and RUNNING depth;
- groups waiting in the assembler, groups in flight in the scheduler;
- staleness: for every model call of an emitted group, ``learner_version - call.weight_version`` (histogram);
- chain breaks (and chains, calls) per harness; trainable vs masked tokens;
- groups emitted / filtered as zero-signal, sessions masked by reason, batches published.
"""

from __future__ import annotations

from collections import Counter
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
        self.groups["emitted" if emitted else "filtered_zero_signal"] += 1
        self._groups.labels("emitted" if emitted else "filtered_zero_signal").inc()
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
        for s in group.sessions:
            if s.trainable:
                self.eval["sessions"] += 1
                self.eval["reward_sum"] += float(s.rows[0].reward)
            else:
                self.eval["masked"] += 1
        self._eval.labels("groups").inc()

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
            "sessions_masked": dict(self.masked),
            "batches": dict(self.batches),
            "eval": {
                **dict(self.eval),
                "mean_reward": self.eval["reward_sum"] / self.eval["sessions"] if self.eval["sessions"] else None,
            },
        }
