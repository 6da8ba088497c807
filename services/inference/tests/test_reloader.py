"""Weight events applied to a real engine without the broker: newer loads, older/equal/broken are skipped."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from contracts import WeightsPublished
from inference.checkpoint import load_checkpoint
from inference.engine import Engine
from inference.reloader import apply_weights_event, checkpoint_path_from_uri


def test_checkpoint_uris() -> None:
    assert checkpoint_path_from_uri("/ckpt/step-3") == Path("/ckpt/step-3")
    assert checkpoint_path_from_uri("file:///ckpt/step-3") == Path("/ckpt/step-3")
    with pytest.raises(ValueError, match="scheme"):
        checkpoint_path_from_uri("s3://bucket/step-3")


async def test_apply_weights_event_only_moves_forward(dev_model_dir: Path, tmp_path: Path) -> None:
    engine = Engine(load_checkpoint(dev_model_dir, version=5))
    # Not newer: ignored without touching the disk (the uri does not even exist).
    assert not await apply_weights_event(engine, WeightsPublished(version=5, uri=str(tmp_path / "nope"), step=5))
    assert not await apply_weights_event(engine, WeightsPublished(version=2, uri=str(tmp_path / "nope"), step=2))
    with pytest.raises(FileNotFoundError):
        await apply_weights_event(engine, WeightsPublished(version=6, uri=str(tmp_path / "missing"), step=6))
    assert await apply_weights_event(engine, WeightsPublished(version=7, uri=f"file://{dev_model_dir}", step=7))
    # A second, older-than-scheduled version is refused by the engine too.
    assert not engine.request_swap(load_checkpoint(dev_model_dir, version=6))
    engine.start()
    try:
        for _ in range(200):
            if engine.version == 7:
                break
            await asyncio.sleep(0.01)
    finally:
        engine.stop()
    assert engine.version == 7 and engine.stats["swaps"] == 1


class _Idle:
    """A weights target that takes nothing (the follower's start-up is what is tested)."""

    version = 0

    async def load_weights(self, path: Path, version: int) -> bool:
        return False


@pytest.mark.integration
async def test_the_follower_creates_a_missing_weights_topic_and_becomes_ready(kafka_settings) -> None:
    # A fresh broker has no floe.weights: the engine used to stay unready until someone ran `floe topics create`.
    import uuid

    from eventbus.admin import list_topics
    from inference.reloader import run_weight_follower

    name = f"floe.weights.fresh-{uuid.uuid4().hex[:8]}"
    assert name not in list_topics(kafka_settings)
    ready = asyncio.Event()
    task = asyncio.create_task(
        run_weight_follower(_Idle(), kafka_settings, topic_name=name, policy_name="policy", ready=ready)
    )
    try:
        await asyncio.wait_for(ready.wait(), 60)
        assert name in list_topics(kafka_settings)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
