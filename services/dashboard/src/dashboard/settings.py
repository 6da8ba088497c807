"""Dashboard settings (env prefix ``FLOE_DASHBOARD_``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["DashboardSettings"]


class DashboardSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FLOE_DASHBOARD_", extra="forbid")

    host: str = "127.0.0.1"
    port: int = 8090
    # The dashboard reads every topic from the beginning with its own throwaway group, so it can be restarted at any
    # time and rebuilds the whole view; it never commits offsets that another service relies on.
    group_prefix: str = "floe-dashboard"
    max_sessions: int = 200
    # Which Kafka client follows the topics: the wire contract, not the library, is what services share
    # (docs/kafka.md). aiokafka by default: asyncio-native, no librdkafka thread; confluent for comparison.
    kafka_client: Literal["aiokafka", "confluent"] = Field(
        default="aiokafka", description="the consumer's client library: aiokafka or confluent (librdkafka)"
    )
