"""Prometheus metrics: the eventbus's own counters and small helpers for services.

Every metric lives in a ``CollectorRegistry``. By default that is ``prometheus_client.REGISTRY`` (what
``health_router`` exposes on ``/metrics``); tests pass their own registry so runs do not collide.
Creating the same metric twice in one registry returns the existing one instead of raising, so services and tests
can build their metrics wherever they need them.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

__all__ = ["BusMetrics", "Children", "bus_metrics", "counter", "gauge", "histogram", "new_registry"]

M = TypeVar("M", bound=MetricWrapperBase)

_lock = threading.Lock()
_made: dict[tuple[int, str], MetricWrapperBase] = {}


class Children:
    """``metric.labels(*values)``, looked up once per label set: ``labels`` validates, takes a lock and builds tuples
    on every call, several times per model call on the gateway's hot path. Not locked: a race builds the same child
    twice, and ``labels`` returns the one child either way."""

    def __init__(self) -> None:
        self._found: dict[tuple[int, tuple[str, ...]], MetricWrapperBase] = {}

    def __call__(self, metric: M, *values: str) -> M:
        key = (id(metric), values)
        found = self._found.get(key)
        if found is None:
            found = self._found[key] = metric.labels(*values)
        return found  # type: ignore[return-value]  # labels() returns the metric's own type


def new_registry() -> CollectorRegistry:
    """A fresh registry (tests, or a service that wants only its own metrics on /metrics)."""
    return CollectorRegistry(auto_describe=True)


def _get_or_make(
    kind: type[M], name: str, doc: str, labels: Sequence[str], registry: CollectorRegistry | None, **kw: object
) -> M:
    reg = registry if registry is not None else REGISTRY
    with _lock:
        found = _made.get((id(reg), name))
        if found is not None:
            if not isinstance(found, kind):
                raise ValueError(f"metric {name!r} already exists as {type(found).__name__}")
            return found
        metric = kind(name, doc, labelnames=tuple(labels), registry=reg, **kw)  # type: ignore[arg-type]
        _made[(id(reg), name)] = metric
        return metric


def counter(name: str, doc: str, labels: Sequence[str] = (), registry: CollectorRegistry | None = None) -> Counter:
    return _get_or_make(Counter, name, doc, labels, registry)


def gauge(name: str, doc: str, labels: Sequence[str] = (), registry: CollectorRegistry | None = None) -> Gauge:
    return _get_or_make(Gauge, name, doc, labels, registry)


def histogram(
    name: str,
    doc: str,
    labels: Sequence[str] = (),
    registry: CollectorRegistry | None = None,
    buckets: Sequence[float] = Histogram.DEFAULT_BUCKETS,
) -> Histogram:
    return _get_or_make(Histogram, name, doc, labels, registry, buckets=tuple(buckets))


@dataclass(frozen=True)
class BusMetrics:
    """The eventbus's metrics (label ``topic``, or ``group`` for consumer-group membership)."""

    produced: Counter
    produce_seconds: Histogram
    consumed: Counter
    dead_lettered: Counter
    committed: Counter
    rejoins: Counter


def bus_metrics(registry: CollectorRegistry | None = None) -> BusMetrics:
    return BusMetrics(
        produced=counter("floe_eventbus_produced_total", "events acknowledged by the broker", ["topic"], registry),
        produce_seconds=histogram(
            "floe_eventbus_produce_seconds",
            "send() to broker acknowledgement",
            ["topic"],
            registry,
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        ),
        consumed=counter(
            "floe_eventbus_consumed_total", "events decoded and handed to the application", ["topic"], registry
        ),
        dead_lettered=counter(
            "floe_eventbus_dead_lettered_total",
            "undecodable messages sent to the dead-letter topic",
            ["topic"],
            registry,
        ),
        committed=counter("floe_eventbus_commits_total", "offset commits (incl. transactional)", ["topic"], registry),
        rejoins=counter(
            "floe_eventbus_group_rejoins_total",
            "consumers replaced by a new group member after librdkafka dropped them (eventbus.membership)",
            ["group"],
            registry,
        ),
    )
