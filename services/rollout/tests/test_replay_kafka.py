"""``replay-rebuild`` from the real broker: a group-less read of recorded events gives the same bytes as an offline
rebuild of the same events, and the ``--from`` bound filters model calls."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from contracts import Event
from eventbus import KafkaSettings, Producer, ensure_topics
from rollout.cli import main
from rollout.replay import rebuild, write_result
from rollout.service import Topics

from .simulate import simulate_groups

pytestmark = pytest.mark.integration


async def _publish(kafka: KafkaSettings, topics: Topics, events: list[Event]) -> None:
    await ensure_topics(kafka, topics.all)
    async with Producer(kafka) as p:
        for event in events:
            await p.send(topics.for_event(event), event)


def test_replay_rebuild_from_kafka_is_byte_identical_to_an_offline_rebuild(
    kafka_settings: KafkaSettings, suffix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    groups = simulate_groups(4, seed=3)
    events = [e for name in sorted(groups) for e in groups[name]]
    topics = Topics.with_suffix(suffix)
    asyncio.run(_publish(kafka_settings, topics, events))
    monkeypatch.setenv("FLOE_KAFKA_BOOTSTRAP_SERVERS", kafka_settings.bootstrap_servers)

    args = ["replay-rebuild", "--builder", "per_request", "--topic-suffix", suffix, "--groups-per-batch", "2"]
    assert main([*args, "--from", "0", "--out", str(tmp_path / "kafka")]) == 0
    write_result(rebuild(events, builder="per_request", groups_per_batch=2), tmp_path / "offline")
    names = sorted(p.name for p in (tmp_path / "offline").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "kafka").iterdir())
    for name in names:
        assert (tmp_path / "kafka" / name).read_bytes() == (tmp_path / "offline" / name).read_bytes()

    # A start after every recorded call: the sessions are still there, masked, because their calls are out of range.
    assert main([*args, "--from", "2100-01-01T00:00:00", "--out", str(tmp_path / "late")]) == 0
    summary = json.loads((tmp_path / "late" / "summary.json").read_text())
    assert summary["groups"] == 4 and summary["reconstruction"]["calls"] == 0
