"""Prometheus metrics of one gateway app (its own registry, so several apps can live in one test process)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from eventbus.metrics import Children

__all__ = ["GatewayMetrics"]


@dataclass
class GatewayMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    # ``child(metric, *labels)``: the labelled child, looked up once per label set (the hot path asks several times
    # per model call).
    child: Children = field(default_factory=Children, repr=False)

    def __post_init__(self) -> None:
        r = self.registry
        self.calls = Counter(
            "floe_gateway_calls_total", "Model calls by protocol and outcome", ["protocol", "status"], registry=r
        )
        self.ttft = Histogram(
            "floe_gateway_ttft_seconds",
            "Time to first token seen by the gateway",
            ["protocol"],
            registry=r,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        self.duration = Histogram("floe_gateway_call_seconds", "Whole call duration", ["protocol"], registry=r)
        self.tokens = Counter("floe_gateway_tokens_total", "Tokens by kind (prompt, completion)", ["kind"], registry=r)
        self.prompt_tokens = self.tokens.labels("prompt")  # both counted on every call: their children, made once
        self.completion_tokens = self.tokens.labels("completion")
        self.rejected = Counter(
            "floe_gateway_rejected_credentials_total", "Calls refused for their credentials", ["reason"], registry=r
        )
        self.records_pending = Gauge(
            "floe_gateway_records_pending", "Records handed to Kafka, not yet acked", registry=r
        )
        self.record_failures = Counter("floe_gateway_record_failures_total", "Records Kafka did not ack", registry=r)
        self.record_bytes = Counter("floe_gateway_record_bytes_total", "Encoded bytes of records sent", registry=r)
        self.inflight = Gauge("floe_gateway_inflight_calls", "Calls being served", registry=r)
        self.exact_chain = Counter(
            "floe_gateway_exact_chain_total",
            "Exact mode: extended a previous call or started a chain",
            ["result"],
            registry=r,
        )
        self.prefix_breaks = Counter(
            "floe_gateway_canonical_prefix_breaks_total",
            "Canonical mode: prompt does not extend the previous call",
            registry=r,
        )
        self.parse_failures = Counter(
            "floe_gateway_tool_call_parse_failures_total", "Tool-call blocks that were not valid JSON", registry=r
        )
        self.unrecorded = Counter(
            "floe_gateway_unrecorded_calls_total",
            "Calls that ended without a ModelCallRecorded, by why (the gateway error's kind, client_disconnected, ...)",
            ["reason"],
            registry=r,
        )
        self.client_disconnects = Counter(
            "floe_gateway_client_disconnects_total", "Streams the client left before the end (not recorded)", registry=r
        )
