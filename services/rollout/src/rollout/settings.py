"""Every knob of the rollout service (env prefix ``FLOE_ROLLOUT_``), built once in ``__main__`` and passed down.

Nested values come as JSON, e.g. ``FLOE_ROLLOUT_EOT_TOKEN_IDS='[151645]'``. Kafka connection settings are
``eventbus.KafkaSettings`` (``FLOE_KAFKA_*``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from contracts import TRAJECTORY_BATCHES, AdvantageMethod, SamplingPolicy, SessionKind, TokenizationMode

__all__ = ["RolloutSettings", "RunSettings"]

MiB = 1024 * 1024


class RunSettings(BaseModel):
    """One run: G sessions per task of a task source, with a harness preset and a sampling policy."""

    model_config = ConfigDict(extra="forbid")

    name: str = "train"
    kind: SessionKind = SessionKind.TRAIN
    task_source: str = Field(default="bundled", description="'bundled' or the path of a SWE-bench-format JSONL")
    task_ids: list[str] | None = Field(default=None, description="subset of the source's tasks (default: all)")
    harness: str = "pi"
    group_size: int = Field(default=8, ge=1)
    sampling: SamplingPolicy = SamplingPolicy()
    tokenization: TokenizationMode = TokenizationMode.EXACT
    model: str = "floe-policy"
    agent_timeout_s: float = Field(default=600.0, gt=0)
    session_timeout_s: float = Field(default=1800.0, gt=0)
    epochs: int | None = None


class RolloutSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FLOE_ROLLOUT_", extra="forbid")

    instance_id: str = Field(default="rollout-0", description="stable per instance: the Kafka transactional id")
    group_id: str = Field(default="rollout", description="Kafka consumer group of the assembler")
    # ---- reconstruction
    builder: Literal["per_request", "prefix_merging"] = "prefix_merging"
    eot_token_ids: list[int] | None = Field(default=None, description="end-of-turn ids (default: auto-detect)")
    advantage: AdvantageMethod = Field(default="mean_std", description="contracts.group_advantages method")
    drop_zero_signal_groups: bool = Field(default=True, description="leave all-equal-reward groups out of batches")
    missing_calls_grace_s: float = Field(default=120.0, gt=0, description="wait this long for late model calls")
    # ---- batches
    groups_per_batch: int = Field(default=1, ge=1)
    inline_max_bytes: int = Field(default=TRAJECTORY_BATCHES.max_message_bytes - MiB, gt=0)
    claim_url: str = Field(default=".floe/rollout/batches", description="directory or fsspec URL for claim checks")
    dataset_dir: str | None = Field(default=".floe/rollout/dataset", description="Parquet dataset; None: off")
    compression: Literal["zstd", "lz4"] | None = "zstd"
    # ---- scheduler
    schedule: bool = Field(default=False, description="publish SessionRequested for the configured runs")
    runs: list[RunSettings] = Field(default_factory=lambda: [RunSettings()])
    max_groups_in_flight: int = Field(default=8, ge=1)
    max_off_policy_steps: int = Field(default=3, ge=0)
    groups_per_step: int = Field(default=4, ge=1)
    min_usable_fraction: float = Field(default=1.0, gt=0, le=1.0)
    grace_sessions: int = Field(default=0, ge=0)
    group_deadline_s: float = Field(default=3600.0, gt=0)
    cancel_grace_s: float = Field(
        default=60.0, gt=0, description="end a cancelled session ourselves (CANCELLED) if its node has not by then"
    )
    tick_s: float = Field(default=0.5, gt=0)
    # ---- topics (tests and side deployments use renamed copies)
    topic_suffix: str = Field(default="", description="appended to every topic name, e.g. '.t-abc123'")
    # ---- HTTP (/state, /metrics)
    http_host: str = "127.0.0.1"
    http_port: int = Field(default=8300, ge=0, le=65535, description="0: pick a free port")
    log_level: str = "INFO"
    # ---- fault injection (tests): hold each transaction that produced a batch open this long before committing,
    # with its outputs already written to the log, so a kill can land mid-transaction.
    pause_before_commit_s: float = Field(default=0.0, ge=0)
