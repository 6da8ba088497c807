"""Where ``floe`` keeps local state, and which Kafka it talks to.

State home: ``--state-dir`` if given, else ``$FLOE_HOME``, else ``.floe/`` at the root of the floe checkout (next
to ``deploy/``), else ``./.floe``. The local broker lives in ``<home>/kafka``.

Kafka: ``--bootstrap`` if given; else ``FLOE_KAFKA_BOOTSTRAP_SERVERS`` (with the other ``FLOE_KAFKA_*`` settings);
else the address of the broker started by ``floe kafka up`` in this home, if it runs; else 127.0.0.1:9092.
"""

from __future__ import annotations

import os
from pathlib import Path

from eventbus import KafkaSettings
from eventbus.broker import BrokerError, LocalBroker, find_kafka_sh

__all__ = ["broker_for", "kafka_settings", "state_home"]


def state_home(explicit: str | None = None) -> Path:
    if explicit:
        return Path(explicit).expanduser().resolve()
    env = os.environ.get("FLOE_HOME")
    if env:
        return Path(env).expanduser().resolve()
    try:
        return find_kafka_sh().resolve().parents[2] / ".floe"
    except BrokerError:
        return Path.cwd() / ".floe"


def broker_for(home: Path) -> LocalBroker:
    return LocalBroker.at(home / "kafka")


def kafka_settings(bootstrap: str | None, home: Path) -> KafkaSettings:
    if bootstrap:
        return KafkaSettings(bootstrap_servers=bootstrap)
    if os.environ.get("FLOE_KAFKA_BOOTSTRAP_SERVERS"):
        return KafkaSettings()
    address_file = home / "kafka" / "address"
    if address_file.is_file():
        try:
            address = broker_for(home).address()
        except BrokerError:
            address = None
        if address:
            return KafkaSettings(bootstrap_servers=address)
    return KafkaSettings()
