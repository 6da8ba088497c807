"""The rollout service over the real broker, in-process, with its real HTTP server on a free port."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from contracts import TrajectoryBatch, WeightsPublished
from eventbus import Consumer, KafkaSettings, Producer, ensure_topics
from rollout.app import create_app
from rollout.batching import load_batch_table
from rollout.replay import rebuild
from rollout.service import Topics
from rollout.settings import RolloutSettings

from .simulate import simulate_groups

pytestmark = pytest.mark.integration


async def _batches(kafka: KafkaSettings, topic: Any, group: str, want_groups: int, timeout_s: float) -> list[Any]:
    seen: list[tuple[TrajectoryBatch, Any]] = []
    groups: set[str] = set()
    deadline = time.monotonic() + timeout_s
    async with Consumer(kafka, [topic], group_id=group) as c:
        while len(groups) < want_groups and time.monotonic() < deadline:
            msg = await c.next(timeout_s=0.5)
            if msg is None:
                continue
            table = load_batch_table(msg.event)
            seen.append((msg.event, table))
            groups.update(table.column("group_id").to_pylist())
    return seen


async def test_service_publishes_every_group_once_and_serves_state(
    kafka_settings: KafkaSettings, rollout_settings: RolloutSettings, suffix: str, consumer_group: str
) -> None:
    topics = Topics.with_suffix(suffix)
    await ensure_topics(kafka_settings, topics.all)
    groups = simulate_groups(6, seed=11)
    names = sorted(groups)
    async with Producer(kafka_settings) as p:
        await p.send(topics.weights, WeightsPublished(version=2, uri="/w/2", step=2))
        for name in names[:3]:
            for event in groups[name]:
                await p.send(topics.for_event(event), event)

    # The same events rebuilt offline: the live service must publish exactly these Arrow bytes (one group per batch).
    offline = {
        b.batch_id: bytes(b.arrow_ipc or b"")
        for b in rebuild(
            [e for name in names for e in groups[name]], builder="prefix_merging", groups_per_batch=1
        ).batches
    }
    sizes = sorted(len(v) for v in offline.values())
    # A threshold between the smallest and the largest batch: some go inline, some by claim check.
    settings = rollout_settings.model_copy(update={"inline_max_bytes": (sizes[0] + sizes[-1]) // 2})
    app = create_app(settings, kafka_settings)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=settings.http_port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{settings.http_port}"
    try:
        async with httpx.AsyncClient(base_url=base, timeout=5) as http:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if (await http.get("/health")).json()["status"] == "ready":
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "service never became ready"
                await asyncio.sleep(0.1)
            async with Producer(kafka_settings) as p:
                for name in names[3:]:
                    for event in groups[name]:
                        await p.send(topics.for_event(event), event)
            seen = await _batches(kafka_settings, topics.batches, consumer_group, len(names), 30)
            state = (await http.get("/state")).json()
            metrics = (await http.get("/metrics")).text
    finally:
        server.should_exit = True
        thread.join(timeout=15)

    published = [g for _, table in seen for g in table.column("group_id").unique().to_pylist()]
    assert sorted(published) == names  # every group exactly once
    assert [b.step for b, _ in seen] == list(range(len(seen)))
    assert any(b.uri for b, _ in seen) and any(b.arrow_ipc is not None for b, _ in seen)
    for batch, _ in seen:
        data = bytes(batch.arrow_ipc) if batch.arrow_ipc is not None else Path(str(batch.uri)).read_bytes()
        assert data == offline[batch.batch_id]
    for batch, table in seen:
        rows = table.to_pylist()
        assert batch.num_rows == len(rows) and batch.builder == "prefix_merging"
        for row in rows:
            if row["masked_reason"]:
                assert not any(row["loss_mask"])
    assert state["groups"]["emitted"] == len(names)
    assert state["tokens"]["trainable"] > 0 and state["tokens"]["masked"] > 0
    assert set(state["chains_by_harness"]) == {"h0", "h1"}
    assert state["sessions_masked"]["infra_failure"] == 2  # groups 2 and 5
    assert state["learner_version"] == 2 and state["staleness_histogram"]
    assert 'floe_rollout_chain_breaks_total{harness="h0"}' in metrics
    assert state["step"] == len(seen)
