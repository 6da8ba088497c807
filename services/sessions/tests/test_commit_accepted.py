"""An accepted request's offset commit: what is weather (tried again, then logged) and what is a bug (raised).

A CI run of tests/e2e/test_hosts_cut.py saw a gateway node, back from a 55 s cut, fail its first commit with
_WAIT_COORD (the group coordinator not yet found again); the node treated it as fatal and stopped. The consumer here
is a stand-in with only ``commit``: what is tested is the node's reading of the error tree, which the eventbus tests
map from real broker errors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from eventbus import BrokerUnavailable, ConfigurationError, EventBusError, KafkaFailure
from sessions.node import commit_accepted

MSG = SimpleNamespace(event=SimpleNamespace(session_id="g-0001-00"), topic="floe.sessions.requested", offset=7)


@dataclass
class Commits:
    errors: list[EventBusError]
    calls: int = 0
    committed: list[Any] = field(default_factory=list)

    async def commit(self, msg: Any) -> None:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        self.committed.append(msg)


async def test_a_coordinator_being_found_again_is_waited_for() -> None:
    waiting = BrokerUnavailable("commit offsets: Local: Waiting for coordinator", code="_WAIT_COORD")
    consumer = Commits([waiting, waiting])
    assert await commit_accepted(consumer, MSG, retry_s=5.0)
    assert consumer.calls == 3 and consumer.committed == [MSG]


async def test_a_commit_that_keeps_failing_is_logged_not_fatal() -> None:
    consumer = Commits([BrokerUnavailable("coordinator away", code="_WAIT_COORD") for _ in range(100)])
    assert not await commit_accepted(consumer, MSG, retry_s=0.5)
    assert 1 < consumer.calls < 100 and consumer.committed == []


async def test_lost_membership_is_not_retried() -> None:
    consumer = Commits([KafkaFailure("gone", code="UNKNOWN_MEMBER_ID", retriable=False)])
    assert not await commit_accepted(consumer, MSG, retry_s=5.0)
    assert consumer.calls == 1


async def test_a_non_retriable_error_is_raised() -> None:
    consumer = Commits([ConfigurationError("bad group.id")])
    with pytest.raises(ConfigurationError):
        await commit_accepted(consumer, MSG, retry_s=5.0)
