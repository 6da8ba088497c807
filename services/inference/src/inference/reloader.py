"""Hot reload: consume ``WeightsPublished`` and hand newer checkpoints to the engine.

Role: one asyncio task per process. Each engine replica must see every version, so the consumer group is unique per
process (``weights_group_id`` unset) and starts from the earliest offset; the topic is compacted, so a late starter
reads just the latest version. Checkpoints load in a worker thread while the engine keeps serving; the engine swaps
at its next wave boundary. Stale or equal versions are skipped; a checkpoint that fails to load is logged and
skipped (the learner's next version will be tried), never fatal.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from urllib.parse import urlparse

import structlog

from contracts import WEIGHTS, WeightsPublished
from eventbus import Consumer, EventBusError, KafkaSettings
from inference.checkpoint import load_checkpoint
from inference.engine import Engine

__all__ = ["checkpoint_path_from_uri", "run_weight_reloader"]

log = structlog.get_logger()


def checkpoint_path_from_uri(uri: str) -> Path:
    """Accept a plain path or a ``file://`` URI (the only scheme an engine can read directly)."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return Path(parsed.path if parsed.scheme == "file" else uri)
    raise ValueError(f"unsupported checkpoint uri scheme {parsed.scheme!r}: {uri}")


async def apply_weights_event(engine: Engine, event: WeightsPublished) -> bool:
    """Load and schedule ``event``'s checkpoint if it is newer than what the engine has. True when scheduled."""
    if event.version <= engine.version:
        log.info("weights_skipped_not_newer", version=event.version, current=engine.version)
        return False
    path = checkpoint_path_from_uri(event.uri)
    checkpoint = await asyncio.to_thread(load_checkpoint, path, version=event.version)
    scheduled = engine.request_swap(checkpoint)
    log.info("weights_scheduled", version=event.version, path=str(path), scheduled=scheduled)
    return scheduled


async def run_weight_reloader(
    engine: Engine,
    kafka: KafkaSettings,
    *,
    topic_name: str,
    policy_name: str,
    group_id: str | None = None,
    ready: asyncio.Event | None = None,
) -> None:
    """Run until cancelled; reconnects with backoff if the broker goes away."""
    topic = WEIGHTS if topic_name == WEIGHTS.name else WEIGHTS.with_name(topic_name)
    group = group_id or f"inference-{uuid.uuid4().hex[:12]}"
    backoff = 0.5
    while True:
        try:
            # The engine is its group's only member: owning no partition for a minute means a lost membership.
            async with Consumer(
                kafka, [topic], group_id=group, auto_offset_reset="earliest", rejoin_after_s=60.0
            ) as consumer:
                if ready is not None:
                    ready.set()
                backoff = 0.5
                async for msg in consumer:
                    event = msg.event
                    if event.base_model == policy_name:
                        try:
                            await apply_weights_event(engine, event)
                        except (OSError, ValueError) as exc:
                            log.error("weights_load_failed", version=event.version, uri=event.uri, error=str(exc))
                    await consumer.commit(msg)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # broker down, auth, anything: keep serving the current weights and retry
            level = log.warning if isinstance(exc, EventBusError) else log.exception
            level("weights_consumer_failed", error=str(exc), error_type=type(exc).__name__, retry_in_s=backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 10.0)
