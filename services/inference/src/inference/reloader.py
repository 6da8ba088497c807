"""Hot reload: follow ``WeightsPublished`` and hand newer checkpoints to the engine that serves them.

Role: the one follower of ``floe.weights`` for both engines, one asyncio task per process. Each engine replica must
see every version, so the consumer group is unique per process (``weights_group_id`` unset) and starts from the
earliest offset; the topic is compacted, so a late starter reads just the latest version. What "applying" means is
the target's business (``WeightsTarget``): the CPU engine loads the checkpoint in a worker thread and swaps at its
next empty-batch boundary (``Engine.load_weights``); in front of vLLM, ``VllmWeights`` drains and reloads in place.

Invariants: stale or equal versions are skipped without touching the disk, so versions never go backwards. A
checkpoint that fails to load or is refused (``OSError``, ``ValueError``, ``WeightsNotLoadedError``) is logged with
its version and path and skipped (the learner's next version will be tried), never fatal. Only ``WeightsLostError``
(the engine no longer knows which weights it holds) stops the follower, which the app treats as a critical failure.
The consumer rejoins as a new member once it has owned no partition for ``REJOIN_AFTER_S`` (it is its group's only
member), and reconnects with backoff if the broker goes away.

Torch-free on purpose: ``--engine vllm`` imports this module and must not load torch next to vLLM.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Protocol
from urllib.parse import urlparse

import structlog

from contracts import WEIGHTS, WeightsPublished
from eventbus import Consumer, EventBusError, KafkaSettings, TopicMissing, ensure_topics

__all__ = [
    "REJOIN_AFTER_S",
    "VERSION_FILE",
    "WeightsLostError",
    "WeightsNotLoadedError",
    "WeightsTarget",
    "apply_weights_event",
    "checkpoint_path_from_uri",
    "read_version",
    "run_weight_follower",
]

log = structlog.get_logger()

VERSION_FILE = "floe.json"
REJOIN_AFTER_S = 60.0
# librdkafka's default max.poll.interval.ms: a target slower than this must say so (``max_apply_s``).
_DEFAULT_MAX_POLL_S = 300.0


class WeightsLostError(RuntimeError):
    """The engine's weights are in an unknown state (a reload failed and so did the restore): only a restart helps.

    The one error that stops the follower; the app turns it into a critical failure (``/health`` 503, exit 1)."""


class WeightsNotLoadedError(Exception):
    """A target did not apply a version and still serves the previous one (the message says why and which)."""


class WeightsTarget(Protocol):
    """An engine the follower feeds: its current version, and how to apply a newer checkpoint."""

    @property
    def version(self) -> int: ...

    async def load_weights(self, path: Path, version: int) -> bool:
        """Apply (or schedule) ``path`` as ``version``; True if taken. Raise OSError, ValueError or
        ``WeightsNotLoadedError`` to refuse it (the follower logs and skips it)."""
        ...


def read_version(path: Path) -> int | None:
    """The version recorded in a checkpoint's ``floe.json``, if any."""
    meta = path / VERSION_FILE
    if not meta.exists():
        return None
    data = json.loads(meta.read_text())
    version = data.get("version")
    return int(version) if version is not None else None


def checkpoint_path_from_uri(uri: str) -> Path:
    """Accept a plain path or a ``file://`` URI (the only scheme an engine can read directly)."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return Path(parsed.path if parsed.scheme == "file" else uri)
    raise ValueError(f"unsupported checkpoint uri scheme {parsed.scheme!r}: {uri}")


async def apply_weights_event(target: WeightsTarget, event: WeightsPublished) -> bool:
    """Hand ``event``'s checkpoint to ``target`` if it is newer than what the target has. True when taken."""
    if event.version <= target.version:
        log.info("weights_skipped_not_newer", version=event.version, current=target.version)
        return False
    path = checkpoint_path_from_uri(event.uri)
    taken = await target.load_weights(path, event.version)
    log.info("weights_scheduled", version=event.version, path=str(path), scheduled=taken)
    return taken


async def run_weight_follower(
    target: WeightsTarget,
    kafka: KafkaSettings,
    *,
    topic_name: str,
    policy_name: str,
    group_id: str | None = None,
    ready: asyncio.Event | None = None,
    max_apply_s: float | None = None,
) -> None:
    """Run until cancelled. ``max_apply_s``: the longest one ``load_weights`` may take (sets max.poll.interval)."""
    topic = WEIGHTS if topic_name == WEIGHTS.name else WEIGHTS.with_name(topic_name)
    group = group_id or f"inference-{uuid.uuid4().hex[:12]}"
    config = {}
    if max_apply_s is not None and max_apply_s + 30 > _DEFAULT_MAX_POLL_S:
        # A drain + reload longer than max.poll.interval would get this member evicted mid-reload.
        config["max.poll.interval.ms"] = int((max_apply_s + 30) * 1000)
    backoff = 0.5
    while True:
        try:
            # A fresh broker has no topics yet: create this one (as every service does for its own) rather than
            # wait, unready, for someone to run `floe topics create`.
            await ensure_topics(kafka, [topic])
            async with Consumer(
                kafka,
                [topic],
                group_id=group,
                auto_offset_reset="earliest",
                rejoin_after_s=REJOIN_AFTER_S,
                sole_member=True,
                config=config,
            ) as consumer:
                if ready is not None:
                    ready.set()
                backoff = 0.5
                async for msg in consumer:
                    event = msg.event
                    if event.base_model == policy_name:
                        try:
                            await apply_weights_event(target, event)
                        except (OSError, ValueError, WeightsNotLoadedError) as exc:
                            log.error("weights_load_failed", version=event.version, uri=event.uri, error=str(exc))
                    await consumer.commit(msg)
        except (asyncio.CancelledError, WeightsLostError):
            raise
        except Exception as exc:  # broker down, auth, anything: keep serving the current weights and retry
            level = log.warning if isinstance(exc, EventBusError) else log.exception
            hint = (
                f"topic {topic.name} is missing and could not be created: `floe topics create` makes it"
                if isinstance(exc, TopicMissing)
                else None
            )
            level(
                "weights_consumer_failed", error=str(exc), error_type=type(exc).__name__, retry_in_s=backoff, hint=hint
            )
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 10.0)
