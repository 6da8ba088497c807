"""Kafka connection settings, shared by every floe service (env prefix ``FLOE_KAFKA_``).

``KafkaSettings()`` reads ``FLOE_KAFKA_BOOTSTRAP_SERVERS`` etc. Credentials are ``SecretStr``: they never appear in
``repr``, logs or ``redacted()``; only ``as_librdkafka()`` (handed straight to the client) contains them. Never log
the result of ``as_librdkafka()``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["KafkaSettings"]

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"]


class KafkaSettings(BaseSettings):
    """Where the brokers are and how to authenticate. Defaults fit the local broker of ``floe kafka up``."""

    model_config = SettingsConfigDict(env_prefix="FLOE_KAFKA_", extra="ignore", frozen=True)

    bootstrap_servers: str = Field(default="127.0.0.1:9092", description="comma-separated host:port list")
    client_id: str = "floe"
    security_protocol: SecurityProtocol = "PLAINTEXT"
    sasl_mechanism: SaslMechanism | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_ca_location: str | None = None
    ssl_certificate_location: str | None = None
    ssl_key_location: str | None = None
    ssl_key_password: SecretStr | None = None
    ssl_endpoint_identification: bool = True
    # -1: the broker's default.replication.factor (1 on the dev broker, 3 on a production cluster).
    replication_factor: int = Field(default=-1, description="replication factor for topics created by ensure_topics")
    admin_timeout_s: float = Field(default=30.0, gt=0)
    delivery_timeout_s: float = Field(default=120.0, gt=0, description="producer: give up delivering after this")
    debug: str | None = Field(
        default=None,
        description="librdkafka debug contexts (e.g. 'cgrp' or 'cgrp,broker'), logged as 'librdkafka' debug events",
    )

    @model_validator(mode="after")
    def _credentials_complete(self) -> KafkaSettings:
        if self.security_protocol.startswith("SASL_"):
            if self.sasl_mechanism is None:
                raise ValueError(f"security_protocol={self.security_protocol} needs sasl_mechanism")
            if self.sasl_mechanism != "OAUTHBEARER" and (self.sasl_username is None or self.sasl_password is None):
                raise ValueError(f"sasl_mechanism={self.sasl_mechanism} needs sasl_username and sasl_password")
        if (self.ssl_certificate_location is None) != (self.ssl_key_location is None):
            raise ValueError("ssl_certificate_location and ssl_key_location go together")
        return self

    def as_librdkafka(self) -> dict[str, Any]:
        """The common librdkafka config (bootstrap, identity, security), *including secrets*: never log it."""
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "client.id": self.client_id,
            "security.protocol": self.security_protocol.lower(),
        }
        if self.sasl_mechanism is not None:
            conf["sasl.mechanism"] = self.sasl_mechanism
        if self.sasl_username is not None:
            conf["sasl.username"] = self.sasl_username
        if self.sasl_password is not None:
            conf["sasl.password"] = self.sasl_password.get_secret_value()
        optional = {
            "ssl.ca.location": self.ssl_ca_location,
            "ssl.certificate.location": self.ssl_certificate_location,
            "ssl.key.location": self.ssl_key_location,
        }
        conf.update({k: v for k, v in optional.items() if v is not None})
        if self.ssl_key_password is not None:
            conf["ssl.key.password"] = self.ssl_key_password.get_secret_value()
        if self.security_protocol in ("SSL", "SASL_SSL"):
            conf["ssl.endpoint.identification.algorithm"] = "https" if self.ssl_endpoint_identification else "none"
        if self.debug:
            conf["debug"] = self.debug
        return conf

    def redacted(self) -> dict[str, Any]:
        """A loggable view: every field, secrets replaced by ``'**********'`` (or None when unset)."""
        return {
            name: ("**********" if isinstance(value, SecretStr) else value) for name, value in self.model_dump().items()
        }
