"""Shared helpers for the eventbus tests: one sample event of every contract type (the lead's golden files)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from contracts import TOPICS, Event, Topic, decode

GOLDEN = Path(__file__).resolve().parents[3] / "schemas" / "tests" / "golden"


def golden_event(topic: Topic[Any]) -> Event:
    raw = (GOLDEN / f"{topic.model.__name__}.json").read_bytes()
    json.loads(raw)  # a broken golden file should fail loudly here, not inside Kafka
    event: Event = decode(topic.model, raw)
    return event


@pytest.fixture
def golden_events() -> dict[str, Event]:
    """Registry topic name -> its golden sample event."""
    return {topic.name: golden_event(topic) for topic in TOPICS}
