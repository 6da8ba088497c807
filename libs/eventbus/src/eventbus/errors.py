"""eventbus's exception tree, and the one place where Kafka client errors become ours.

Tree (``retriable`` is a class attribute: may the *same* operation succeed if simply tried again later?)::

    EventBusError                   root; .retriable = False, .code = the Kafka error name when there is one
    ├── BrokerUnavailable           retriable: cannot reach the cluster / a leader / a coordinator right now
    ├── OperationTimeout            retriable: the call or the delivery did not complete before its deadline
    ├── TopicMissing                the topic (or partition) does not exist: create it (ensure_topics)
    ├── MessageTooLarge             the encoded event exceeds the client's or the topic's max.message.bytes
    ├── SerializationFailed         an event could not be encoded (wrong type for the topic, invalid model)
    ├── AuthenticationFailed        SASL/TLS handshake or ACL authorisation failed: fix the credentials
    ├── ConfigurationError          invalid client or topic configuration, unsupported feature/version
    ├── ClientStateError            the client was used wrongly (closed, concurrent use, no open transaction)
    ├── TransactionError            exactly-once machinery
    │   ├── TransactionAborted      retriable: the transaction was aborted; re-consume from committed offsets
    │   └── ProducerFenced          fatal: another instance with the same transactional.id / group member took over
    └── KafkaFailure                any other broker/client error (``code`` tells which); retriable as Kafka says

``map_kafka_errors()`` is the only translation point: every public eventbus call that touches confluent_kafka runs
inside it, so callers only ever see this tree (with the original exception as ``__cause__``).
``libs/eventbus/tests/test_errors.py`` checks that every exception class confluent_kafka exports is mapped.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import ClassVar

import confluent_kafka
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.serialization import SerializationError

__all__ = [
    "AuthenticationFailed",
    "BrokerUnavailable",
    "ClientStateError",
    "ConfigurationError",
    "EventBusError",
    "KafkaFailure",
    "MessageTooLarge",
    "OperationTimeout",
    "ProducerFenced",
    "SerializationFailed",
    "TopicMissing",
    "TransactionAborted",
    "TransactionError",
    "from_kafka_error",
    "map_exception",
    "map_kafka_errors",
]


class EventBusError(Exception):
    """Root of every eventbus error."""

    retriable: ClassVar[bool] = False

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class BrokerUnavailable(EventBusError):
    retriable = True


class OperationTimeout(EventBusError):
    retriable = True


class TopicMissing(EventBusError):
    pass


class MessageTooLarge(EventBusError):
    pass


class SerializationFailed(EventBusError):
    pass


class AuthenticationFailed(EventBusError):
    pass


class ConfigurationError(EventBusError):
    pass


class ClientStateError(EventBusError):
    pass


class TransactionError(EventBusError):
    pass


class TransactionAborted(TransactionError):
    retriable = True


class ProducerFenced(TransactionError):
    pass


class KafkaFailure(EventBusError):
    """An error without a more specific class. ``retriable`` is per instance here, as librdkafka reports it."""

    def __init__(self, message: str, *, code: str | None = None, retriable: bool = False) -> None:
        super().__init__(message, code=code)
        self.retriable = retriable  # type: ignore[misc]  # per-instance override of the ClassVar, on purpose


# ------------------------------------------------------------------------------------------ KafkaError codes

_E = KafkaError
_BY_CODE: dict[int, type[EventBusError]] = {}


def _register(cls: type[EventBusError], *names: str) -> None:
    for name in names:
        code = getattr(_E, name, None)  # codes differ a little between librdkafka versions
        if isinstance(code, int):
            _BY_CODE[code] = cls


_register(
    BrokerUnavailable,
    "_ALL_BROKERS_DOWN",
    "_TRANSPORT",
    "_RESOLVE",
    "_DESTROY_BROKER",
    "_WAIT_COORD",
    "_UNKNOWN_BROKER",
    "BROKER_NOT_AVAILABLE",
    "LEADER_NOT_AVAILABLE",
    "NOT_LEADER_FOR_PARTITION",
    "NETWORK_EXCEPTION",
    "COORDINATOR_NOT_AVAILABLE",
    "COORDINATOR_LOAD_IN_PROGRESS",
    "NOT_COORDINATOR",
    "NOT_CONTROLLER",
    "REPLICA_NOT_AVAILABLE",
    "NOT_ENOUGH_REPLICAS",
    "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
    "KAFKA_STORAGE_ERROR",
    "_ISR_INSUFF",
    "REBOOTSTRAP_REQUIRED",
)
_register(OperationTimeout, "_TIMED_OUT", "_MSG_TIMED_OUT", "_TIMED_OUT_QUEUE", "REQUEST_TIMED_OUT")
_register(TopicMissing, "_UNKNOWN_TOPIC", "_UNKNOWN_PARTITION", "UNKNOWN_TOPIC_OR_PART", "UNKNOWN_TOPIC_ID")
_register(MessageTooLarge, "MSG_SIZE_TOO_LARGE", "RECORD_LIST_TOO_LARGE", "_MSG_SIZE_TOO_LARGE", "INVALID_MSG_SIZE")
_register(
    SerializationFailed,
    "_KEY_SERIALIZATION",
    "_VALUE_SERIALIZATION",
    "_KEY_DESERIALIZATION",
    "_VALUE_DESERIALIZATION",
)
_register(
    AuthenticationFailed,
    "_AUTHENTICATION",
    "_SSL",
    "SASL_AUTHENTICATION_FAILED",
    "ILLEGAL_SASL_STATE",
    "UNSUPPORTED_SASL_MECHANISM",
    "TOPIC_AUTHORIZATION_FAILED",
    "GROUP_AUTHORIZATION_FAILED",
    "CLUSTER_AUTHORIZATION_FAILED",
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
    "DELEGATION_TOKEN_AUTHORIZATION_FAILED",
    "UNACCEPTABLE_CREDENTIAL",
)
_register(
    ConfigurationError,
    "_INVALID_ARG",
    "_NOT_CONFIGURED",
    "_UNSUPPORTED_FEATURE",
    "_NOT_IMPLEMENTED",
    "INVALID_CONFIG",
    "INVALID_PARTITIONS",
    "INVALID_REPLICATION_FACTOR",
    "INVALID_REPLICA_ASSIGNMENT",
    "INVALID_REQUIRED_ACKS",
    "INVALID_SESSION_TIMEOUT",
    "INVALID_TRANSACTION_TIMEOUT",
    "UNSUPPORTED_VERSION",
    "UNSUPPORTED_COMPRESSION_TYPE",
    "POLICY_VIOLATION",
    "INVALID_GROUP_ID",
    "TOPIC_EXCEPTION",
    "SECURITY_DISABLED",
)
_register(ClientStateError, "_STATE", "_DESTROY", "_PREV_IN_PROGRESS", "_CONFLICT", "_EXISTING_SUBSCRIPTION")
_register(
    ProducerFenced,
    "_FENCED",
    "PRODUCER_FENCED",
    "INVALID_PRODUCER_EPOCH",
    "TRANSACTION_COORDINATOR_FENCED",
    "FENCED_INSTANCE_ID",
)
_register(TransactionAborted, "TRANSACTION_ABORTABLE")


def from_kafka_error(err: KafkaError, context: str = "") -> EventBusError:
    """Translate one ``KafkaError`` (with its retriable/fatal/abortable flags) into our tree."""
    code = err.code()
    name = err.name()
    message = f"{context}: {err.str()} ({name})" if context else f"{err.str()} ({name})"
    # librdkafka's own flags decide first: they are per occurrence, not per code.
    if err.fatal():
        cls = _BY_CODE.get(code)
        if cls in (ProducerFenced, AuthenticationFailed, ConfigurationError):
            return cls(message, code=name)
        return ProducerFenced(message, code=name) if _is_txn_code(code) else KafkaFailure(message, code=name)
    if err.txn_requires_abort():
        return TransactionAborted(message, code=name)
    cls = _BY_CODE.get(code)
    if cls is not None:
        return cls(message, code=name)
    if code == getattr(_E, "_MAX_POLL_EXCEEDED", None):
        # A notice, not a failure: the group dropped a consumer that did not poll for max.poll.interval.ms, and its
        # next poll rejoins. Commits of what it handed out before fail; those messages come again.
        return KafkaFailure(message, code=name, retriable=True)
    return KafkaFailure(message, code=name, retriable=bool(err.retriable()))


def _is_txn_code(code: int) -> bool:
    return code in {getattr(_E, n, None) for n in ("_FENCED", "PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH")}


# ------------------------------------------------------------------------------------ exception classes


def map_exception(exc: BaseException, context: str = "") -> EventBusError | None:
    """The mapping ``map_kafka_errors`` applies, as a function (None: not a Kafka client error).

    Order matters: every confluent_kafka exception class derives from ``KafkaException``; serialisation errors are
    checked first because they are ours to fix, not the broker's.
    """
    prefix = f"{context}: " if context else ""
    if isinstance(exc, EventBusError):
        return exc
    if isinstance(exc, SerializationError):  # Key/Value(De)SerializationError
        return SerializationFailed(prefix + str(exc))
    if isinstance(exc, KafkaException):  # also ConsumeError / ProduceError (_KafkaClientError)
        arg = exc.args[0] if exc.args else None
        if isinstance(arg, KafkaError):
            return from_kafka_error(arg, context)
        return KafkaFailure(prefix + str(exc))
    if isinstance(exc, confluent_kafka.IllegalStateException | confluent_kafka.ConcurrentModificationException):
        return ClientStateError(prefix + str(exc))
    if isinstance(exc, BufferError):  # librdkafka's local queue is full (queue.buffering.max.*)
        return BrokerUnavailable(prefix + f"local producer queue full: {exc}")
    return None


@contextmanager
def map_kafka_errors(context: str = "") -> Iterator[None]:
    """Run a block that calls confluent_kafka; re-raise its errors as ``EventBusError`` (``from`` the original)."""
    try:
        yield
    except EventBusError:
        raise
    except Exception as exc:
        mapped = map_exception(exc, context)
        if mapped is None:
            raise
        raise mapped from exc
