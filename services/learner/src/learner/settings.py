"""Learner settings: every knob, read once from ``FLOE_LEARNER_*`` environment variables (or passed explicitly).

Defaults follow Polar's SWE-Gym recipe (docs/polar-comparison.md, "Optimizer recipe"): AdamW lr 1e-6, betas (0.9, 0.98),
weight decay 0.1, clip 0.2 / 0.28, TIS on (cap 2), k3 KL with coefficient 0.001, gradient clipping at 1.0.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import structlog
from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from contracts import TRAJECTORY_BATCHES, WEIGHTS
from learner.data import Layout
from learner.grpo import Aggregation, LossConfig

__all__ = ["LearnerSettings"]

# Renamed settings: old field -> new field. The old name (keyword or FLOE_LEARNER_<OLD>) still works, with a warning.
_RENAMED = {"batches_topic": "trajectory_batches_topic"}


class LearnerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FLOE_LEARNER_", extra="forbid")

    # Model and checkpoints
    model_dir: Path = Field(description="base model directory (safetensors + config + tokenizer); version 0")
    model_wait_s: float = Field(
        default=0.0,
        ge=0,
        description="wait up to this long for model_dir to appear (another service writes it, as compose's "
        "inference does); 0: fail at once when it is missing",
    )
    checkpoint_dir: Path = Field(description="one sub-directory per published weight version")
    policy_name: str = Field(default="policy", description="WeightsPublished.base_model (the compacted topic key)")
    keep_checkpoints: int = Field(default=3, ge=1, description="newest versions kept on disk")

    # Optimiser
    lr: float = Field(default=1e-6, gt=0)
    betas: tuple[float, float] = (0.9, 0.98)
    weight_decay: float = Field(default=0.1, ge=0)
    adam_eps: float = Field(default=1e-8, gt=0)
    max_grad_norm: float = Field(default=1.0, gt=0)
    optimizer_steps_per_batch: int = Field(default=1, ge=1, description="PPO mini-batches per trajectory batch")

    # Loss
    clip_low: float = 0.2
    clip_high: float = 0.28
    tis_cap: float = 2.0
    kl_coef: float = Field(default=0.001, ge=0)
    loss_agg: Aggregation = "token-mean"
    max_staleness: int | None = Field(default=3, ge=0, description="max weight-version lag of a trained token")
    temperature: float = Field(default=1.0, gt=0, description="the sampler's temperature (logits are divided by it)")
    skip_zero_advantage_rows: bool = Field(
        default=True,
        description="with no KL term and one optimizer step per batch, a row whose advantage is 0 has a zero "
        "gradient: leave it out of forward and backward (same update; its tokens still count in the loss normaliser)",
    )
    step_without_signal: bool = Field(
        default=False,
        description="step AdamW on a batch whose every row has advantage 0 (a zero gradient: only the momentum of "
        "earlier batches and the weight decay move the weights); off: such a batch makes a version with unchanged "
        "weights. Only with skip_zero_advantage_rows in effect (no KL term, one optimizer step per batch)",
    )

    # Batching and hardware
    micro_batch_tokens: int = Field(
        default=8192, gt=0, description="token slots per micro-batch: real tokens when packed, rows x longest if padded"
    )
    micro_batch_layout: Layout = Field(
        default="packed",
        description="packed: a micro-batch's sequences back to back in one row, each attending to itself only; "
        "padded: one right-padded row per sequence (same loss and gradients, plus the padding's compute)",
    )
    max_seq_len: int = Field(default=32768, gt=1)
    device: str = Field(default="auto", description="auto | cpu | cuda")
    bf16: bool | None = Field(
        default=None, description="bf16 compute (weights and optimizer stay fp32); default: on for CUDA, off on CPU"
    )
    gradient_checkpointing: bool | None = Field(default=None, description="default: on for CUDA, off on CPU")
    strategy: Literal["ddp", "fsdp"] = "ddp"
    seed: int = 0

    # Kafka
    group_id: str = "learner"
    max_step_s: float = Field(
        default=3600.0,
        ge=10.0,
        description="longest train step incl. checkpoint and publish (librdkafka max.poll.interval.ms); a longer "
        "step costs a redelivery of its batch, which the ledger skips",
    )
    rejoin_after_s: float = Field(
        default=60.0,
        gt=0,
        description="rejoin the consumer group as a new member after owning no partition this long (rank 0 is its "
        "group's only member, so it should always own the batches partition)",
    )
    # Topic names (tests use renamed copies): <registry topic>_topic, as in every service's settings.
    trajectory_batches_topic: str = TRAJECTORY_BATCHES.name
    weights_topic: str = WEIGHTS.name

    # Test hook: sleep this long inside each step, after backward and before the optimizer step, so a crash test
    # can kill the process mid-step deterministically. Never set in production.
    debug_step_delay_s: float = Field(default=0.0, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        for old, new in _RENAMED.items():
            old_env = f"FLOE_LEARNER_{old.upper()}"
            if old in data:
                name, use, value = old, new, data.pop(old)
            else:
                name, use, value = old_env, f"FLOE_LEARNER_{new.upper()}", os.environ.get(old_env)
            if value is not None:
                # A fresh logger each time: settings are built before and after logging is configured.
                structlog.get_logger().warning("deprecated_setting", name=name, use=use)
                data.setdefault(new, value)  # the new name wins when both are set
        return data

    @model_validator(mode="after")
    def _check(self) -> LearnerSettings:
        self.loss_config()  # asserts its invariants early
        # A misspelt knob must not silently fall back to its default.
        known = {f"FLOE_LEARNER_{name.upper()}" for name in [*type(self).model_fields, *_RENAMED]}
        unknown = sorted(k for k in os.environ if k.startswith("FLOE_LEARNER_") and k not in known)
        if unknown:
            raise ValueError(f"unknown learner setting(s) in the environment: {', '.join(unknown)}")
        return self

    def loss_config(self) -> LossConfig:
        return LossConfig(clip_low=self.clip_low, clip_high=self.clip_high, tis_cap=self.tis_cap, kl_coef=self.kl_coef)
