"""Noticing a consumer-group member that librdkafka dropped and that never joins again.

librdkafka can lose a member's place in its group and stay out: the fault-tolerance test saw it after broker
restarts, once for the learner's consumer and once for the rollout leader's transactional processor. While the
coordinator is down the client times out its session ("SESSTMOUT ... revoking assignment and rejoining group"),
revokes its partitions, and then never sends a JoinGroup again; the broker, back, drops the member when its
heartbeats stop and the group sits empty. Nothing raises: the service just gets no more input.

``Membership`` tracks since when a member has owned no partition (rebalance callbacks run on the client's thread;
the event loop reads) and decides, once that lasts too long, whether to rejoin; ``Consumer`` and
``TransactionalProcessor`` then replace their client (``close_within`` closes the old one, bounded). The decision
depends on the member:

- one that should always own partitions (the only member of its group, such as the learner) rejoins at once;
- one that may own nothing by design (a standby rollout leader, a scorer beyond the partition count) first asks the
  group's coordinator (``dropped_from_group``): it rejoins only if the group has settled without it, so a healthy
  standby (listed) or a member in the middle of a rebalance never forces another rebalance.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import structlog
from confluent_kafka import ConsumerGroupState, KafkaException

from eventbus.admin import admin_client
from eventbus.errors import EventBusError
from eventbus.settings import KafkaSettings

__all__ = ["Membership", "close_within", "dropped_from_group"]

log = structlog.get_logger()


class Membership:
    """One member's watch over its own place in ``group_id`` (see the module docstring). Rebalance callbacks report
    what is assigned and revoked; ``dropped()`` says when to replace the client with a new member."""

    def __init__(
        self, settings: KafkaSettings, group_id: str, after_s: float | None, *, sole_member: bool = False
    ) -> None:
        if after_s is not None and after_s <= 0:
            raise ValueError("rejoin_after_s must be positive")
        self._settings = settings
        self._group_id = group_id
        self.after_s = after_s  # None: not watched
        self.sole_member = sole_member
        self._owned: set[tuple[str, int]] = set()
        self._since: float | None = time.monotonic()  # since when nothing is owned; None while something is

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

    def seconds(self) -> float:
        """How long nothing has been owned (0 while something is)."""
        since = self._since
        return 0.0 if since is None else time.monotonic() - since

    def due(self) -> bool:
        """Owned nothing for longer than ``after_s``: time for ``dropped()`` to look (cheap; ask it freely)."""
        return self.after_s is not None and self.seconds() > self.after_s

    async def dropped(self, member_id: Callable[[], Awaitable[str | None]]) -> bool:
        """Once ``due()``: whether this member should rejoin. A sole member should at once; any other only if the
        coordinator has settled without it (``dropped_from_group``). Otherwise the count starts again."""
        if not self.due():
            return False
        if self.sole_member or await dropped_from_group(self._settings, self._group_id, await member_id()):
            return True
        self.restart()  # listed (a standby), rebalancing, or the broker cannot say: look again later
        return False


async def close_within(client: Any, executor: ThreadPoolExecutor, timeout_s: float = 10.0) -> bool:
    """Close a librdkafka consumer on its worker thread (its leave request lets the group move on at once). False if
    the close failed or hung: the caller must never touch that client, nor a hung thread, again."""
    try:
        await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(executor, client.close), timeout_s)
        return True
    except Exception as exc:
        log.warning("old consumer client did not close; abandoned", error=repr(exc))
        return False


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
