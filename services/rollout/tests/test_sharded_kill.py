"""Three rollout instances share the work; ``kill -9`` of the leader mid-transaction, then of a shard: nothing lost,
nothing published twice.

Three ``python -m rollout`` processes (distinct instance ids, one consumer group) consume the events of 36 groups,
published in chunks, their events shuffled across neighbouring groups. The leader is killed while its transaction
holds a batch written to the log but not committed (``pause_before_commit_s``); later one of the two survivors is
killed at a random moment, so its partitions (and whatever groups it was half-way through) move to the last one.
Then a ``read_committed`` reader must see every group in exactly one batch, steps 0..n-1 once each, and the bytes
an offline rebuild of the same events gives; before the first kill at least two instances must have assembled
groups (the work really was shared), and after it another instance must have become the leader.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import Counter
from pathlib import Path

import pytest

from contracts import Event
from eventbus import KafkaSettings, ensure_topics
from rollout.batching import load_batch_table
from rollout.replay import rebuild
from rollout.service import Topics
from rollout.settings import RolloutSettings

from .procs import Service, publish, read_topic
from .simulate import simulate_groups

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.scale]

GROUPS = 36
CHUNKS = 4


async def _wait_any(services: list[Service], text: str, timeout_s: float) -> Service | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for s in services:
            if s.count(text):
                return s
        await asyncio.sleep(0.1)
    return None


async def test_three_instances_share_the_groups_and_survive_two_kills(
    kafka_settings: KafkaSettings, rollout_settings: RolloutSettings, suffix: str, tmp_path: Path
) -> None:
    rng = random.Random(7)
    topics = Topics.with_suffix(suffix)
    await ensure_topics(kafka_settings, topics.all)
    groups = simulate_groups(GROUPS, seed=3)
    events = [e for name in sorted(groups) for e in groups[name]]
    offline = {b.batch_id: bytes(b.arrow_ipc or b"") for b in rebuild(events, builder="prefix_merging").batches}
    ordered: list[Event] = []
    names = sorted(groups)
    for i in range(0, GROUPS, 3):
        window = [e for name in names[i : i + 3] for e in groups[name]]
        rng.shuffle(window)
        ordered.extend(window)
    n = len(ordered)
    chunks = [ordered[n * i // CHUNKS : n * (i + 1) // CHUNKS] for i in range(CHUNKS)]

    base = {
        **os.environ,
        "FLOE_KAFKA_BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers,
        "FLOE_ROLLOUT_TOPIC_SUFFIX": suffix,
        "FLOE_ROLLOUT_GROUP_ID": rollout_settings.group_id,
        "FLOE_ROLLOUT_DATASET_DIR": str(rollout_settings.dataset_dir),
        "FLOE_ROLLOUT_CLAIM_URL": rollout_settings.claim_url,
        "FLOE_ROLLOUT_HTTP_PORT": "0",
        "FLOE_ROLLOUT_TICK_S": "0.2",
        "FLOE_ROLLOUT_GROUP_SELECTION": "off",
        "FLOE_ROLLOUT_PAUSE_BEFORE_COMMIT_S": "1.5",
        # The killed leader's open transaction holds the next leader's rebuild back until it times out (the default
        # 60 s would outlast the waits below).
        "FLOE_ROLLOUT_TRANSACTION_TIMEOUT_S": "15",
    }
    services = [Service({**base, "FLOE_ROLLOUT_INSTANCE_ID": f"{rollout_settings.instance_id}-{i}"}) for i in range(3)]
    try:
        for s in services:
            assert s.wait_for("rollout service ready", 60), "an instance never became ready"
        # All three in the group before the first group arrives, so the first chunk is already shared out.
        await asyncio.sleep(4)
        await publish(kafka_settings, topics, chunks[0])
        leader = await _wait_any(services, "paused before commit", 60)
        assert leader is not None, "no leader ever produced a batch"
        assembling = [s for s in services if s.count('"group assembled"')]
        assert len(assembling) >= 2, f"only {len(assembling)} instance(s) assembled groups: the work was not shared"
        leader.kill9()  # mid-transaction: its batch is in the log, uncommitted
        survivors = [s for s in services if s is not leader]

        await publish(kafka_settings, topics, chunks[1])
        assert await _wait_any(survivors, '"rollout leader"', 60), "no survivor took the leadership"
        await publish(kafka_settings, topics, chunks[2])
        await asyncio.sleep(rng.uniform(0.5, 2.0))
        victim = rng.choice(survivors)
        victim.kill9()
        last = next(s for s in survivors if s is not victim)
        await publish(kafka_settings, topics, chunks[3])

        deadline = time.monotonic() + 120
        while True:
            committed = await read_topic(kafka_settings, topics.batches, "read_committed", settle_s=0.5)
            published = {g for b in committed for g in load_batch_table(b).column("group_id").unique().to_pylist()}
            if len(published) == GROUPS or time.monotonic() > deadline:
                break
        assert last.proc.poll() is None, "the last instance died"
    finally:
        for s in services:
            s.stop()
            s.count("")  # read what is left, so a failure shows each instance's last lines
            print(f"--- {s.proc.args} rc={s.proc.returncode}\n" + "".join(s.tail[-25:]))

    committed = await read_topic(kafka_settings, topics.batches, "read_committed")
    uncommitted = await read_topic(kafka_settings, topics.batches, "read_uncommitted")
    counts = Counter(g for b in committed for g in load_batch_table(b).column("group_id").unique().to_pylist())
    assert counts == Counter({name: 1 for name in groups}), "a group was lost or published twice"
    assert sorted(b.step for b in committed) == list(range(len(committed)))
    assert len(uncommitted) > len(committed), "the leader's kill did not land inside an open transaction"
    for batch in committed:
        data = bytes(batch.arrow_ipc) if batch.arrow_ipc is not None else Path(str(batch.uri)).read_bytes()
        assert data == offline[batch.batch_id]
    assembled = await read_topic(kafka_settings, topics.groups, "read_committed")
    assert Counter(e.group_id for e in assembled) == Counter({name: 1 for name in groups}), "a group assembled twice"
