"""Every gateway knob, read once from the environment (prefix ``FLOE_GATEWAY_``) and passed down explicitly.

List values are JSON in the environment, e.g. ``FLOE_GATEWAY_ENGINE_URLS='["http://a:8000","http://b:8000"]'``.
Unknown ``FLOE_GATEWAY_*`` variables are rejected (``extra="forbid"``), so a typo fails at start-up.
"""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from contracts import MODEL_CALLS, SamplingPolicy, TokenizationMode

__all__ = ["BILLING_HEADER_PATTERN", "GatewaySettings"]

# Claude Code's first system block: a per-prompt hash that would break every prefix across tasks
# (docs/harnesses.md, "Claude Code").
BILLING_HEADER_PATTERN = r"(?m)^x-anthropic-billing-header:[^\n]*\n?"


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FLOE_GATEWAY_", extra="forbid")

    host: str = "127.0.0.1"
    port: int = 8080
    public_url: str = Field(default="", description="base URL harnesses use; default http://{host}:{port}")

    engine_urls: list[str] = Field(default_factory=lambda: ["http://127.0.0.1:8000"])
    engine_model: str | None = Field(default=None, description="model id sent to the engine; None: ask /v1/models")
    engine_timeout_s: float = 900.0
    engine_connect_timeout_s: float = 5.0
    engine_unhealthy_s: float = Field(
        default=10.0, description="how long a replica that refused a connection is skipped"
    )
    engine_stream_interval: int = Field(
        default=16,
        ge=1,
        description="a streamed answer's tokens arrive from the engine (and go to the harness) in chunks of this many, "
        "the first token and the end at once (vLLM's per-request stream_interval); 1: one event per token",
    )

    control_token: SecretStr | None = Field(default=None, description="bearer token for /admin/*; None: admin disabled")
    session_ttl_s: float = 7200.0
    default_tokenization: TokenizationMode = TokenizationMode.EXACT
    default_sampling: SamplingPolicy = SamplingPolicy()
    strict_models: bool = Field(default=False, description="reject model names other than the session's / aliases")
    model_aliases: list[str] = Field(default_factory=list)

    default_max_tokens: int = Field(default=1024, ge=1, description="when the harness sends no max tokens")
    max_tokens_cap: int | None = Field(default=None, ge=1, description="upper bound on any request's max tokens")
    volatile_patterns: list[str] = Field(default_factory=lambda: [BILLING_HEADER_PATTERN])

    model_calls_topic: str = MODEL_CALLS.name
    log_level: str = Field(default="INFO", description="DEBUG adds a line per recorded call (~7 % of a call's CPU)")
    run_sessions: bool = Field(
        default=False,
        description="deprecated: `python -m gateway` with this set hands over to `python -m sessions` (a gateway "
        "node: proxy + session runner, whose own settings use the FLOE_GATEWAY_SESSIONS_ prefix)",
    )
    delta_encoding: bool = Field(default=True, description="encode prompts against the session's previous calls")
    record_request_max_bytes: int = 256 * 1024
    max_pending_records: int = Field(default=1000, ge=1, description="above this, new calls get 503 (backpressure)")
    record_timeout_s: float = 30.0
    record_linger_ms: float = Field(
        default=0.0,
        ge=0,
        description="how long the Kafka producer holds a record to batch it with others (librdkafka linger.ms): every "
        "call's end waits for its record, so this is added to each call; records produced while a request to the "
        "broker is in flight are batched anyway",
    )
    retry_after_s: float = 5.0
    pause_timeout_s: float = 300.0

    max_body_bytes: int = 32 * 1024 * 1024
    exact_history: int = Field(default=8, ge=1, description="previous calls per session kept for exact-mode chaining")

    def base_url(self) -> str:
        return (self.public_url or f"http://{self.host}:{self.port}").rstrip("/")
