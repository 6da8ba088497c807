"""Settings of the inference service (env prefix ``FLOE_INFERENCE_``) and of floe's download cache (``FLOE_CACHE``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from contracts import WEIGHTS

__all__ = ["CacheSettings", "InferenceSettings"]


class InferenceSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FLOE_INFERENCE_", extra="ignore")

    model_dir: Path = Field(default=Path(".floe/models/dev"), description="checkpoint directory to serve at start")
    init_if_missing: bool = Field(default=True, description="create the tiny dev model at model_dir if absent")
    served_model_name: str = "policy"
    accept_any_model: bool = Field(default=False, description="vLLM rejects unknown `model` names; this accepts any")
    host: str = "127.0.0.1"
    port: int = 8100
    weight_version: int | None = Field(default=None, description="overrides floe.json of the initial checkpoint")
    max_batch: int = Field(default=16, ge=1)
    batch_wait_ms: float = Field(default=5.0, ge=0.0)
    prefill_chunk: int = Field(default=1024, ge=16)
    max_model_len: int | None = Field(default=None, ge=16, description="defaults to the model's max positions")
    default_max_tokens: int = Field(default=1024, ge=1, description="used when a request sets no max_tokens")
    max_logprobs: int = Field(default=20, ge=0, description="vLLM's --max-logprobs")
    threads: int | None = Field(
        default=1, ge=1, description="torch intra-op threads; 1 suits the tiny model and shared machines (None: all)"
    )
    seed: int | None = Field(default=None, description="seed of the generator used by unseeded requests")
    consume_weights: bool = Field(default=True, description="hot-reload from WeightsPublished events")
    weights_topic: str = WEIGHTS.name
    weights_group_id: str | None = Field(default=None, description="default: a fresh group per process")
    policy_name: str = Field(default="policy", description="only WeightsPublished with this base_model apply")
    engine: Literal["cpu", "vllm"] = Field(
        default="cpu", description="cpu: this package's engine; vllm: a proxy in front of vLLM (inference.vllm_proxy)"
    )
    vllm_serve_script: Path | None = Field(
        default=None, description="deploy/vllm/serve.sh; default: found above the working directory or this package"
    )
    vllm_url: str | None = Field(
        default=None, description="proxy to this running vLLM (dev mode) instead of starting one with serve.sh"
    )
    vllm_port: int | None = Field(default=None, description="127.0.0.1 port of the vLLM we start; default: a free one")
    vllm_start_timeout_s: float = Field(default=1800.0, gt=0, description="until the vLLM we start is healthy")
    vllm_timeout_s: float = Field(default=600.0, gt=0, description="longest silence of vLLM within one request")
    vllm_drain_timeout_s: float = Field(
        default=600.0, gt=0, description="a reload waits this long for running requests, else that version is skipped"
    )
    vllm_reload_timeout_s: float = Field(default=600.0, gt=0, description="for vLLM's reload_weights call")
    vllm_watch_s: float = Field(
        default=2.0, gt=0, description="how often the proxy checks that vLLM still holds the version it stamps"
    )


class CacheSettings(BaseSettings):
    """``FLOE_CACHE``: downloads and builds kept between runs (models, the vLLM venv of deploy/vllm/venv.sh)."""

    model_config = SettingsConfigDict(env_prefix="FLOE_", extra="ignore")

    cache: Path = Field(default_factory=lambda: Path.home() / ".cache" / "floe")
