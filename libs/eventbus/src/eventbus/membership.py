"""Noticing a consumer-group member that librdkafka dropped and that never joins again.

librdkafka can lose a member's place in its group and stay out: the fault-tolerance test saw it after broker
restarts, once for the learner's consumer and once for the rollout leader's transactional processor. While the
coordinator is down the client times out its session ("SESSTMOUT ... revoking assignment and rejoining group"),
revokes its partitions, and then never sends a JoinGroup again; the broker, back, drops the member when its
heartbeats stop and the group sits empty. Nothing raises: the service just gets no more input.

``Unowned`` tracks since when a member has owned no partition (rebalance callbacks run on the client's thread;
the event loop reads). What to do once that lasts too long depends on the member:

- one that should always own partitions (the only member of its group, such as the learner) rejoins at once;
- one that may own nothing by design (a standby rollout leader, a scorer beyond the partition count) first asks the
  group's coordinator (``dropped_from_group``): it rejoins only if the group has settled without it, so a healthy
  standby (listed) or a member in the middle of a rebalance never forces another rebalance.
"""

from __future__ import annotations

import asyncio
import time

import structlog
from confluent_kafka import ConsumerGroupState, KafkaException

from eventbus.admin import admin_client
from eventbus.errors import EventBusError
from eventbus.settings import KafkaSettings

__all__ = ["Unowned", "dropped_from_group"]

log = structlog.get_logger()


class Unowned:
    """Since when a group member has owned no partition; ``due()`` once that is longer than ``after_s`` (never when
    it is None: a member that is not watched)."""

    def __init__(self, after_s: float | None) -> None:
        if after_s is not None and after_s <= 0:
            raise ValueError("after_s must be positive")
        self.after_s = after_s
        self._owned: set[tuple[str, int]] = set()
        self._since: float | None = time.monotonic()

    def restart(self) -> None:
        """A new client (or a verdict that all is well): nothing owned, counting from now."""
        self._owned = set()
        self._since = time.monotonic()

    def assigned(self, partitions: set[tuple[str, int]]) -> None:
        self._owned = self._owned | partitions
        if self._owned:
            self._since = None

    def revoked(self, partitions: set[tuple[str, int]]) -> None:
        self._owned = self._owned - partitions
        if not self._owned and self._since is None:
            self._since = time.monotonic()

    @property
    def owned(self) -> frozenset[tuple[str, int]]:
        return frozenset(self._owned)

    def seconds(self) -> float:
        """How long nothing has been owned (0 while something is)."""
        since = self._since
        return 0.0 if since is None else time.monotonic() - since

    def due(self) -> bool:
        return self.after_s is not None and self.seconds() > self.after_s


# While a group rebalances, a member that has asked to join may not be listed yet: that is not a dropped member.
_SETTLED = (ConsumerGroupState.STABLE, ConsumerGroupState.EMPTY, ConsumerGroupState.DEAD)


def _dropped_sync(settings: KafkaSettings, group_id: str, member_id: str | None, timeout_s: float) -> bool | None:
    try:
        admin = admin_client(settings)
        description = admin.describe_consumer_groups([group_id], request_timeout=timeout_s)[group_id].result(
            timeout=timeout_s
        )
    except (KafkaException, EventBusError, TimeoutError) as exc:
        log.info("could not describe consumer group", group_id=group_id, error=repr(exc))
        return None
    if description.state not in _SETTLED:
        return False
    return not (member_id and any(m.member_id == member_id for m in description.members))


async def dropped_from_group(
    settings: KafkaSettings, group_id: str, member_id: str | None, timeout_s: float = 10.0
) -> bool | None:
    """True when the group's coordinator has settled (stable or empty) without listing ``member_id`` (a client with
    no member id is listed nowhere); False while it lists it or is rebalancing; None when the broker cannot say
    (then rejoining would not help either)."""
    return await asyncio.to_thread(_dropped_sync, settings, group_id, member_id, timeout_s)
