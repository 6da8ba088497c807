"""The public surface of ``eventbus`` is curated: every name in ``__all__`` exists and nothing public is missing."""

from __future__ import annotations

import inspect

import eventbus

EXPECTED = {
    "AuthenticationFailed",
    "BrokerUnavailable",
    "ClientStateError",
    "ConfigurationError",
    "Consumer",
    "Delivery",
    "EventBusError",
    "Follower",
    "KafkaFailure",
    "KafkaSettings",
    "Message",
    "MessageTooLarge",
    "OperationTimeout",
    "Producer",
    "ProducerFenced",
    "SerializationFailed",
    "TopicInfo",
    "TopicMissing",
    "TransactionAborted",
    "TransactionError",
    "TransactionalProcessor",
    "before_shutdown",
    "configure_logging",
    "critical_failure",
    "critical_task",
    "describe_topics",
    "ensure_topics",
    "ensure_topics_sync",
    "health_router",
    "list_topics",
    "map_kafka_errors",
    "serve",
}


def test_all_is_exactly_the_curated_surface() -> None:
    assert set(eventbus.__all__) == EXPECTED
    assert sorted(eventbus.__all__) == eventbus.__all__, "keep __all__ sorted"


def test_every_exported_name_exists_and_is_documented() -> None:
    for name in eventbus.__all__:
        obj = getattr(eventbus, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert obj.__module__.startswith("eventbus."), name


def test_no_public_module_attribute_is_left_out() -> None:
    public = {n for n, v in vars(eventbus).items() if not n.startswith("_") and not inspect.ismodule(v)}
    assert public == set(eventbus.__all__)
