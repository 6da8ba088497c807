"""The Kafka -> eventbus error mapping is complete and keeps librdkafka's retriable/fatal/abortable semantics."""

from __future__ import annotations

import inspect
import types

import confluent_kafka
import confluent_kafka.admin
import confluent_kafka.error
import confluent_kafka.serialization
import pytest
from confluent_kafka import KafkaError, KafkaException

from eventbus import errors
from eventbus.errors import (
    BrokerUnavailable,
    ClientStateError,
    EventBusError,
    KafkaFailure,
    MessageTooLarge,
    OperationTimeout,
    ProducerFenced,
    SerializationFailed,
    TopicMissing,
    TransactionAborted,
    from_kafka_error,
    map_exception,
    map_kafka_errors,
)

MODULES: tuple[types.ModuleType, ...] = (
    confluent_kafka,
    confluent_kafka.error,
    confluent_kafka.admin,
    confluent_kafka.serialization,
)


def exported_exception_classes() -> list[type[BaseException]]:
    found: set[type[BaseException]] = set()
    for module in MODULES:
        for name in dir(module):
            obj = getattr(module, name)
            if (
                inspect.isclass(obj)
                and issubclass(obj, BaseException)
                and obj.__module__.startswith(("confluent_kafka", "cimpl"))
            ):
                found.add(obj)
    return sorted(found, key=lambda c: c.__qualname__)


def instance_of(cls: type[BaseException]) -> BaseException:
    """Build an instance the way confluent_kafka raises it (most take a KafkaError as first argument)."""
    err = KafkaError(KafkaError._MSG_TIMED_OUT, "boom")
    for args in ((err,), ("boom",), ()):
        try:
            return cls(*args)
        except TypeError:
            continue
    raise AssertionError(f"cannot instantiate {cls}")


def test_the_exception_census_is_not_empty() -> None:
    # If confluent_kafka reorganises its modules, this test must notice instead of passing on nothing.
    names = {c.__name__ for c in exported_exception_classes()}
    assert {"KafkaException", "ConsumeError", "ProduceError", "SerializationError"} <= names


@pytest.mark.parametrize("cls", exported_exception_classes(), ids=lambda c: str(c.__name__))
def test_every_confluent_exception_class_is_mapped(cls: type[BaseException]) -> None:
    exc = instance_of(cls)
    mapped = map_exception(exc, "ctx")
    assert isinstance(mapped, EventBusError), f"{cls.__qualname__} is not mapped"
    with pytest.raises(EventBusError) as info, map_kafka_errors("ctx"):
        raise exc
    assert info.value.__cause__ is exc


def test_serialization_errors_are_ours_to_fix() -> None:
    for cls in (confluent_kafka.error.KeySerializationError, confluent_kafka.error.ValueDeserializationError):
        assert isinstance(map_exception(cls(), ""), SerializationFailed)


def test_builtins_confluent_raises_are_mapped_and_others_pass_through() -> None:
    assert isinstance(map_exception(BufferError("Local: Queue full")), BrokerUnavailable)
    with pytest.raises(ValueError), map_kafka_errors():  # not a Kafka error: untouched
        raise ValueError("mine")


def all_error_codes() -> dict[str, int]:
    return {
        n: getattr(KafkaError, n)
        for n in dir(KafkaError)
        if n.lstrip("_").isupper() and isinstance(getattr(KafkaError, n), int)
    }


def test_every_kafka_error_code_maps_to_a_class_of_the_tree() -> None:
    codes = all_error_codes()
    assert len(codes) > 100
    for name, code in codes.items():
        mapped = from_kafka_error(KafkaError(code), "ctx")
        assert isinstance(mapped, EventBusError), name
        assert mapped.code == KafkaError(code).name(), name


@pytest.mark.parametrize(
    ("code", "cls", "retriable"),
    [
        (KafkaError._ALL_BROKERS_DOWN, BrokerUnavailable, True),
        (KafkaError._TRANSPORT, BrokerUnavailable, True),
        (KafkaError._MSG_TIMED_OUT, OperationTimeout, True),
        (KafkaError.UNKNOWN_TOPIC_OR_PART, TopicMissing, False),
        (KafkaError._UNKNOWN_TOPIC, TopicMissing, False),
        (KafkaError.MSG_SIZE_TOO_LARGE, MessageTooLarge, False),
        (KafkaError.PRODUCER_FENCED, ProducerFenced, False),
        (KafkaError._STATE, ClientStateError, False),
        (KafkaError._MAX_POLL_EXCEEDED, KafkaFailure, True),  # a notice: the next poll rejoins the group
    ],
)
def test_key_codes_map_to_their_class(code: int, cls: type[EventBusError], retriable: bool) -> None:
    mapped = from_kafka_error(KafkaError(code))
    assert type(mapped) is cls
    assert mapped.retriable is retriable


def test_librdkafka_flags_take_precedence() -> None:
    abortable = KafkaError(KafkaError._MSG_TIMED_OUT, "x", txn_requires_abort=True)
    assert isinstance(from_kafka_error(abortable), TransactionAborted)
    assert from_kafka_error(abortable).retriable is True
    fatal = KafkaError(KafkaError._FENCED, "x", fatal=True)
    assert isinstance(from_kafka_error(fatal), ProducerFenced)
    unknown_fatal = KafkaError(KafkaError._FAIL, "x", fatal=True)
    assert type(from_kafka_error(unknown_fatal)) is KafkaFailure
    assert from_kafka_error(unknown_fatal).retriable is False


def test_unlisted_code_keeps_librdkafkas_retriable_flag() -> None:
    code = KafkaError.REBALANCE_IN_PROGRESS
    assert type(from_kafka_error(KafkaError(code, "x", retriable=True))) is KafkaFailure
    assert from_kafka_error(KafkaError(code, "x", retriable=True)).retriable is True
    assert from_kafka_error(KafkaError(code, "x", retriable=False)).retriable is False


def test_kafka_exception_without_kafka_error_is_still_mapped() -> None:
    mapped = map_exception(KafkaException("plain text"), "ctx")
    assert isinstance(mapped, KafkaFailure) and "plain text" in str(mapped)


def test_tree_is_shallow_and_documented() -> None:
    classes = [getattr(errors, n) for n in errors.__all__ if inspect.isclass(getattr(errors, n))]
    for cls in classes:
        depth = len([c for c in cls.__mro__ if issubclass(c, EventBusError)])
        assert depth <= 3, cls
        assert cls.__name__ in (errors.__doc__ or ""), f"{cls.__name__} missing from the tree in errors.py's docstring"
