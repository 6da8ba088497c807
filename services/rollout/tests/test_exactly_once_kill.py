"""``kill -9`` of the rollout service at any moment, then a restart: no trajectory batch lost, none duplicated.

The service runs as a real subprocess (``python -m rollout``) over the real broker. Events of 18 groups are published
in chunks, shuffled across groups, while the service is killed five times: on odd kills while it holds a transaction
open *after* its batch was written to the log (``pause_before_commit_s``), on even kills at a random moment. A last
incarnation runs to the end. Then a ``read_committed`` reader must see every group in exactly one batch, steps
0..n-1 once each, and the same Arrow bytes an offline rebuild of the same events gives; a ``read_uncommitted``
reader proves that aborted batches really were written (the kills did land mid-transaction); the Parquet dataset
holds every trajectory once.

``FLOE_ROLLOUT_EOS_RUNS=5`` repeats the whole scenario.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from contracts import Event
from eventbus import KafkaSettings, ensure_topics
from rollout.batching import load_batch_table
from rollout.replay import rebuild
from rollout.service import Topics
from rollout.settings import RolloutSettings

from .procs import Service, publish, read_topic
from .simulate import simulate_groups

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RUNS = int(os.environ.get("FLOE_ROLLOUT_EOS_RUNS", "1"))
KILLS = 5
GROUPS = 18


@pytest.mark.parametrize("run", range(RUNS))
async def test_kill_9_at_any_moment_neither_loses_nor_duplicates_a_batch(
    run: int, kafka_settings: KafkaSettings, rollout_settings: RolloutSettings, suffix: str, tmp_path: Path
) -> None:
    rng = random.Random(1000 + run)
    topics = Topics.with_suffix(suffix)
    await ensure_topics(kafka_settings, topics.all)
    groups = simulate_groups(GROUPS, seed=run)
    events = [e for name in sorted(groups) for e in groups[name]]
    offline = {b.batch_id: bytes(b.arrow_ipc or b"") for b in rebuild(events, builder="prefix_merging").batches}
    sizes = sorted(len(v) for v in offline.values())
    # Groups complete progressively (about three per chunk), their events interleaved with the neighbouring groups'.
    ordered: list[Event] = []
    names = sorted(groups)
    for i in range(0, GROUPS, 2):
        window = [e for name in names[i : i + 2] for e in groups[name]]
        rng.shuffle(window)
        ordered.extend(window)
    n = len(ordered)
    chunks = [ordered[n * i // (KILLS + 1) : n * (i + 1) // (KILLS + 1)] for i in range(KILLS + 1)]

    env = {
        **os.environ,
        "FLOE_KAFKA_BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers,
        "FLOE_ROLLOUT_TOPIC_SUFFIX": suffix,
        "FLOE_ROLLOUT_INSTANCE_ID": rollout_settings.instance_id,
        "FLOE_ROLLOUT_GROUP_ID": rollout_settings.group_id,
        "FLOE_ROLLOUT_DATASET_DIR": str(rollout_settings.dataset_dir),
        "FLOE_ROLLOUT_CLAIM_URL": rollout_settings.claim_url,
        "FLOE_ROLLOUT_HTTP_PORT": "0",
        "FLOE_ROLLOUT_TICK_S": "0.2",
        "FLOE_ROLLOUT_GROUP_SELECTION": "off",
        "FLOE_ROLLOUT_INLINE_MAX_BYTES": str((sizes[0] + sizes[-1]) // 2),
    }
    mid_transaction_kills = 0
    for kill in range(KILLS):
        await publish(kafka_settings, topics, chunks[kill])
        service = Service({**env, "FLOE_ROLLOUT_PAUSE_BEFORE_COMMIT_S": "3"})
        try:
            assert service.wait_for("rollout service ready", 60), "service never became ready"
            if kill % 2 == 0:
                # Kill while a transaction that already wrote its batch to the log is still open.
                # The rollout is a dynamic group member: its inputs are assigned only once the group drops the
                # incarnation killed before it (session timeout, 10 s), so the first batch can take that long.
                if service.wait_for("paused before commit", 30):
                    mid_transaction_kills += 1
            else:
                await asyncio.sleep(rng.uniform(0.0, 1.5))
        finally:
            service.kill9()
    assert mid_transaction_kills >= 2, "the kills did not land inside open transactions"

    await publish(kafka_settings, topics, chunks[KILLS])
    final = Service(env)
    try:
        assert final.wait_for("rollout service ready", 60)
        deadline = time.monotonic() + 60
        while True:
            committed = await read_topic(kafka_settings, topics.batches, "read_committed", settle_s=0.5)
            published = Counter(
                g for b in committed for g in load_batch_table(b).column("group_id").unique().to_pylist()
            )
            if len(published) == GROUPS or time.monotonic() > deadline:
                break
    finally:
        final.stop()

    committed = await read_topic(kafka_settings, topics.batches, "read_committed")
    uncommitted = await read_topic(kafka_settings, topics.batches, "read_uncommitted")
    published = Counter(g for b in committed for g in load_batch_table(b).column("group_id").unique().to_pylist())
    assert published == Counter({name: 1 for name in groups}), "a group was lost or published twice"
    assert sorted(b.step for b in committed) == list(range(len(committed)))
    assert len({b.batch_id for b in committed}) == len(committed)
    assert len(uncommitted) > len(committed), "no aborted batch was ever written: the kills missed the transactions"
    for batch in committed:
        data = bytes(batch.arrow_ipc) if batch.arrow_ipc is not None else Path(str(batch.uri)).read_bytes()
        assert data == offline[batch.batch_id]
    dataset = Path(str(rollout_settings.dataset_dir))
    files = sorted(p.stem for p in dataset.glob("*.parquet"))
    assert files == sorted(groups)
    ids = [i for p in dataset.glob("*.parquet") for i in pq.read_table(p).column("trajectory_id").to_pylist()]
    assert len(ids) == len(set(ids)) == sum(load_batch_table(b).num_rows for b in committed)
