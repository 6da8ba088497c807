"""KafkaSettings: env prefix, librdkafka translation, SASL/TLS validation, secrets never shown."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from eventbus import KafkaSettings


def test_defaults_point_at_the_local_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("FLOE_KAFKA_BOOTSTRAP_SERVERS", "FLOE_KAFKA_SECURITY_PROTOCOL", "FLOE_KAFKA_DEBUG"):
        monkeypatch.delenv(var, raising=False)
    s = KafkaSettings()
    assert s.bootstrap_servers == "127.0.0.1:9092"
    assert s.as_librdkafka() == {
        "bootstrap.servers": "127.0.0.1:9092",
        "client.id": "floe",
        "security.protocol": "plaintext",
    }


def test_librdkafka_debug_contexts_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOE_KAFKA_DEBUG", "cgrp,broker")
    assert KafkaSettings().as_librdkafka()["debug"] == "cgrp,broker"


def test_env_prefix_and_sasl_ssl(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOE_KAFKA_BOOTSTRAP_SERVERS", "b1:9093,b2:9093")
    monkeypatch.setenv("FLOE_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("FLOE_KAFKA_SASL_MECHANISM", "SCRAM-SHA-512")
    monkeypatch.setenv("FLOE_KAFKA_SASL_USERNAME", "floe")
    monkeypatch.setenv("FLOE_KAFKA_SASL_PASSWORD", "hunter2-secret")
    monkeypatch.setenv("FLOE_KAFKA_SSL_CA_LOCATION", "/etc/ca.pem")
    s = KafkaSettings()
    conf = s.as_librdkafka()
    assert conf["bootstrap.servers"] == "b1:9093,b2:9093"
    assert conf["security.protocol"] == "sasl_ssl"
    assert conf["sasl.mechanism"] == "SCRAM-SHA-512"
    assert conf["sasl.username"] == "floe"
    assert conf["sasl.password"] == "hunter2-secret"
    assert conf["ssl.ca.location"] == "/etc/ca.pem"
    assert conf["ssl.endpoint.identification.algorithm"] == "https"


def test_secrets_never_appear_in_repr_str_or_redacted_view() -> None:
    s = KafkaSettings(
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_username="u",
        sasl_password="hunter2-secret",  # type: ignore[arg-type]
        ssl_key_password="key-secret",  # type: ignore[arg-type]
    )
    for text in (repr(s), str(s), str(s.redacted()), s.model_dump_json()):
        assert "hunter2-secret" not in text
        assert "key-secret" not in text
    assert s.redacted()["sasl_password"] == "**********"


def test_incomplete_credentials_are_rejected() -> None:
    with pytest.raises(ValidationError, match="needs sasl_mechanism"):
        KafkaSettings(security_protocol="SASL_SSL")
    with pytest.raises(ValidationError, match="needs sasl_username and sasl_password"):
        KafkaSettings(security_protocol="SASL_SSL", sasl_mechanism="PLAIN", sasl_username="u")
    with pytest.raises(ValidationError, match="go together"):
        KafkaSettings(ssl_certificate_location="/c.pem")
    with pytest.raises(ValidationError):
        KafkaSettings(security_protocol="TLS")  # type: ignore[arg-type]


async def test_librdkafka_accepts_the_translated_config() -> None:
    # librdkafka itself validates property names and values when a client is built (no broker needed).
    import confluent_kafka

    from eventbus.consumer import consumer_config
    from eventbus.producer import producer_config

    s = KafkaSettings(security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN", sasl_username="u", sasl_password="p")  # type: ignore[arg-type]
    confluent_kafka.Producer(producer_config(s)).flush(0)
    confluent_kafka.Consumer(consumer_config(s, "g")).close()
