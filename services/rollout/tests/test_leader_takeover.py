"""A leader taking over behind a dead leader's open transaction publishes no batch twice.

The log of ``floe.trajectory-batches`` as a third leader finds it: leader A died mid-transaction with the batch of
step 0 written (open: it blocks read_committed readers until ``transaction.timeout.ms``); leader B, which took over
next, published steps 0 and 1 again and committed them, then died too. The batches B committed sit behind A's open
transaction, where a read_committed reader stops. A leader that read the batches topic only that far (as it did before
2026-12-06, when a CI run published 31 of 36 groups twice this way) saw no batch and published them all again. Now
its rebuild waits (retrying) until A's transaction ends and then publishes only the group left: step 2.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections import Counter

import confluent_kafka
import pytest

from contracts import TrajectoryBatch, encode
from eventbus import KafkaSettings, ensure_topics
from rollout.batching import load_batch_table
from rollout.replay import rebuild
from rollout.service import Topics
from rollout.settings import RolloutSettings

from .procs import Service, publish, read_topic
from .simulate import simulate_groups

pytestmark = [pytest.mark.integration]


def _transactional(kafka: KafkaSettings, name: str) -> confluent_kafka.Producer:
    conf = {**kafka.as_librdkafka(), "transactional.id": f"{name}-{uuid.uuid4().hex[:8]}"}
    producer = confluent_kafka.Producer({**conf, "transaction.timeout.ms": 120_000})  # never times out in the test
    producer.init_transactions(30)
    producer.begin_transaction()
    return producer


def _write(producer: confluent_kafka.Producer, topics: Topics, batches: list[TrajectoryBatch]) -> None:
    for batch in batches:
        producer.produce(topics.batches.name, encode(batch), batch.batch_id.encode())
    assert producer.flush(30) == 0


def _groups(batch: TrajectoryBatch) -> list[str]:
    return list(load_batch_table(batch).column("group_id").unique().to_pylist())


async def test_a_leader_behind_a_dead_leaders_open_transaction_publishes_no_batch_twice(
    kafka_settings: KafkaSettings, rollout_settings: RolloutSettings, suffix: str
) -> None:
    topics = Topics.with_suffix(suffix)
    await ensure_topics(kafka_settings, topics.all)
    groups = simulate_groups(3, seed=5)
    events = [e for name in sorted(groups) for e in groups[name]]
    offline = rebuild(events, builder="prefix_merging").batches
    assert [b.step for b in offline] == [0, 1, 2]

    dead_a = _transactional(kafka_settings, "leader-a")
    _write(dead_a, topics, offline[:1])  # never committed: A is "killed" here
    leader_b = _transactional(kafka_settings, "leader-b")
    _write(leader_b, topics, offline[:2])
    leader_b.commit_transaction(30)

    await publish(kafka_settings, topics, events)
    service = Service(
        {
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
        }
    )
    try:
        assert service.wait_for("rebuild from the topics failed; retrying", 60), (
            "the leader did not wait for the open transaction:\n" + "".join(service.tail[-20:])
        )
        assert not service.count('"batch produced"'), "a batch was produced before the batches topic was read"
        await asyncio.to_thread(dead_a.abort_transaction, 30)  # what the coordinator does at its timeout
        assert service.wait_for('"rollout leader"', 60), "".join(service.tail[-20:])
        assert service.wait_for('"batch produced"', 60), "".join(service.tail[-20:])
        await asyncio.sleep(2)  # a second, wrong batch would be produced by now
    finally:
        service.stop()
        service.count("")
        print("".join(service.tail[-30:]))

    committed = await read_topic(kafka_settings, topics.batches, "read_committed")
    counts = Counter(g for b in committed for g in _groups(b))
    assert counts == Counter(dict.fromkeys(groups, 1)), "a group was lost or published twice"
    assert sorted(b.step for b in committed) == [0, 1, 2]
    left = set(groups) - {*_groups(offline[0]), *_groups(offline[1])}
    assert [_groups(b) for b in committed if b.step == 2] == [sorted(left)]
