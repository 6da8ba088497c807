"""Every knob of the rollout service (env prefix ``FLOE_ROLLOUT_``), built once in ``__main__`` and passed down.

Nested values come as JSON, e.g. ``FLOE_ROLLOUT_EOT_TOKEN_IDS='[151645]'``. Kafka connection settings are
``eventbus.KafkaSettings`` (``FLOE_KAFKA_*``).

Deprecated: ``FLOE_ROLLOUT_DROP_ZERO_SIGNAL_GROUPS`` (``drop_zero_signal_groups``) is read as ``group_selection``
(``true``: ``refill``, ``false``: ``off``) with a ``deprecated_setting`` warning; ``group_selection`` wins when both
are set. ``true`` was the default and meant "leave zero-signal groups out of full batches", which is ``refill``'s
batch shape; ``refill`` also lets the scheduler admit the replacements that the old flag never asked for (without
them a run could stall, see ``rollout.scheduler``).
"""

from __future__ import annotations

import os
import socket
from typing import Any, Literal

import structlog
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from contracts import TRAJECTORY_BATCHES, AdvantageMethod, SamplingPolicy, SessionKind, TokenizationMode
from rollout.selection import GroupSelection

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
    epochs: int | None = Field(default=None, ge=1, description="passes over the tasks; eval: rounds")
    every_steps: int | None = Field(
        default=None, ge=1, description="eval only: round r waits for learner version r * every_steps"
    )
    shuffle_seed: int | None = Field(
        default=0,
        description="train runs: each pass visits the tasks in an order drawn from this seed (None: as listed)",
    )

    @model_validator(mode="after")
    def _check(self) -> RunSettings:
        if self.every_steps is not None and self.kind is not SessionKind.EVAL:
            raise ValueError(f"run {self.name!r}: every_steps is for eval runs only")
        return self


class RolloutSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FLOE_ROLLOUT_", extra="forbid")

    instance_id: str = Field(
        default_factory=lambda: f"rollout-{socket.gethostname()}",
        description="stable per instance and distinct between instances: the shard's Kafka transactional id (the "
        "leader's is <instance_id>-leader); default rollout-<hostname>, one instance per host",
    )
    group_id: str = Field(
        default="rollout", description="Kafka consumer group every instance joins (the leaders use <group_id>-leader)"
    )
    # ---- reconstruction
    builder: Literal["per_request", "prefix_merging"] = "prefix_merging"
    eot_token_ids: list[int] | None = Field(default=None, description="end-of-turn ids (default: auto-detect)")
    advantage: AdvantageMethod = Field(default="mean_std", description="contracts.group_advantages method")
    group_selection: GroupSelection = Field(
        default="refill", description="zero-signal groups: off (kept), refill (dropped, replaced), drop (Polar)"
    )
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
    max_steps: int | None = Field(default=None, ge=0, description="no train group for rollout step >= this")
    min_usable_fraction: float = Field(default=1.0, gt=0, le=1.0)
    grace_sessions: int = Field(default=0, ge=0)
    group_deadline_s: float = Field(default=3600.0, gt=0)
    cancel_grace_s: float = Field(
        default=60.0, gt=0, description="end a cancelled session ourselves (CANCELLED) if its node has not by then"
    )
    tick_s: float = Field(default=0.5, gt=0)
    transaction_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="the Kafka transaction.timeout.ms of the shard's and the leader's transactions, in seconds: an "
        "instance killed mid-transaction leaves it open this long, and the rebuilds of the others wait for it to end "
        "before they read the groups and batches topics. A transaction is one poll of input, well under a second, but "
        "librdkafka also bounds each message's delivery by it: at 15 s tests/e2e/test_scale_out stalled in 2 of 4 "
        "runs (cause not found), at 60 s in none of 4",
    )
    # ---- topics (tests and side deployments use renamed copies)
    topic_suffix: str = Field(default="", description="appended to every topic name, e.g. '.t-abc123'")
    # ---- HTTP (/state, /metrics)
    http_host: str = "127.0.0.1"
    http_port: int = Field(default=8300, ge=0, le=65535, description="0: pick a free port")
    log_level: str = "INFO"
    # ---- fault injection (tests): hold each transaction that produced a batch open this long before committing,
    # with its outputs already written to the log, so a kill can land mid-transaction.
    pause_before_commit_s: float = Field(default=0.0, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _deprecated(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        old, env = "drop_zero_signal_groups", "FLOE_ROLLOUT_DROP_ZERO_SIGNAL_GROUPS"
        if old in data:
            name, value = old, data.pop(old)
        else:
            name, value = env, os.environ.get(env)
        if value is not None:
            # A fresh logger each time: settings are built before and after logging is configured.
            structlog.get_logger().warning("deprecated_setting", name=name, use="FLOE_ROLLOUT_GROUP_SELECTION")
            if "group_selection" not in data and "FLOE_ROLLOUT_GROUP_SELECTION" not in os.environ:
                data["group_selection"] = "refill" if TypeAdapter(bool).validate_python(value) else "off"
        return data

    @model_validator(mode="after")
    def _check(self) -> RolloutSettings:
        if self.schedule and self.group_selection != "drop" and self.groups_per_batch > self.groups_per_step:
            # A batch would need more kept groups than the lag bound admits ahead of the learner: it eventually waits
            # for groups that are never requested (rollout.scheduler, "Why this always progresses").
            raise ValueError(
                f"groups_per_batch ({self.groups_per_batch}) > groups_per_step ({self.groups_per_step}) stalls the "
                "scheduler; use groups_per_batch <= groups_per_step"
            )
        return self
