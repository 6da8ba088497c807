"""floe's shared Kafka runtime: the only package that imports a Kafka client.

``KafkaSettings`` (env ``FLOE_KAFKA_*``), ``configure_logging``, ``ensure_topics``, ``Producer`` (idempotent,
acks=all, ``await send()`` returns once acked), ``Consumer`` (read_committed, manual commits, poison messages to
the dead-letter topic), ``TransactionalProcessor`` (exactly-once consume→produce), ``Follower`` (every partition
from the beginning and on, no consumer group), the error tree in ``eventbus.errors``, ``health_router`` (/health,
/metrics), metric helpers, and crash-only serving (``serve``, ``critical_task``, ``critical_failure``). Test
fixtures: ``eventbus.testing``.
"""

from eventbus.admin import TopicInfo, describe_topics, ensure_topics, ensure_topics_sync, list_topics
from eventbus.consumer import Consumer, Message
from eventbus.errors import (
    AuthenticationFailed,
    BrokerUnavailable,
    ClientStateError,
    ConfigurationError,
    EventBusError,
    KafkaFailure,
    MessageTooLarge,
    OperationTimeout,
    ProducerFenced,
    SerializationFailed,
    TopicMissing,
    TransactionAborted,
    TransactionError,
    map_kafka_errors,
)
from eventbus.follow import Follower
from eventbus.health import health_router
from eventbus.logging import configure_logging
from eventbus.producer import Delivery, Producer
from eventbus.serving import before_shutdown, critical_failure, critical_task, serve
from eventbus.settings import KafkaSettings
from eventbus.transactional import TransactionalProcessor

__all__ = [
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
]
