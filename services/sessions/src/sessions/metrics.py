"""Prometheus metrics of the session runner (its own registry unless the node passes the gateway's)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["SessionMetrics"]

_LATENCY = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


@dataclass
class SessionMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.pool_depth = Gauge("floe_sessions_pool_ready", "Prepared workspaces waiting in the READY pool", registry=r)
        self.pool_preparing = Gauge("floe_sessions_pool_preparing", "Workspaces being prepared", registry=r)
        self.pool_hits = Counter(
            "floe_sessions_pool_acquire_total",
            "Workspace acquisitions by source (pool hit or cold)",
            ["source"],
            registry=r,
        )
        self.prepare_seconds = Histogram(
            "floe_sessions_prepare_seconds", "Materialize + prepare steps", registry=r, buckets=_LATENCY
        )
        self.ready_wait_seconds = Histogram(
            "floe_sessions_ready_wait_seconds", "Time in READY waiting for an agent slot", registry=r, buckets=_LATENCY
        )
        self.start_latency_seconds = Histogram(
            "floe_sessions_start_latency_seconds", "Accepted request -> agent running", registry=r, buckets=_LATENCY
        )
        self.sessions = Counter("floe_sessions_finished_total", "Finished sessions by state", ["state"], registry=r)
        self.active = Gauge("floe_sessions_active", "Sessions accepted and not yet finished", registry=r)
        self.running = Gauge("floe_sessions_running", "Harnesses running now", registry=r)
        self.duplicates = Counter(
            "floe_sessions_duplicate_requests_total", "Redelivered SessionRequested ignored", registry=r
        )
