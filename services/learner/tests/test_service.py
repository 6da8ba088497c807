"""The learner against a real Kafka broker: consume batches, publish weights, exactly-once across a kill -9."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from contracts import DEAD_LETTER, TRAJECTORY_BATCHES, WEIGHTS, TrajectoryBatch, WeightsPublished, to_ipc
from eventbus import Consumer, Producer
from learner import LearnerSettings, serve, train_files
from learner.checkpoint import latest_checkpoint, read_state

from .synthetic import per_request_rows, synthetic_sessions

LINEAR = {"lr": 1.0, "adam_eps": 1.0, "weight_decay": 0.0, "kl_coef": 0.0}


def make_batches(n: int, seed: int = 0) -> list[bytes]:
    rng = random.Random(seed)
    return [to_ipc(per_request_rows(synthetic_sessions(2, 3, 2, rng))) for _ in range(n)]


def inline(batch_id: str, data: bytes) -> TrajectoryBatch:
    return TrajectoryBatch(
        batch_id=batch_id, step=0, num_rows=12, num_groups=2, num_sessions=6, builder="per_request",
        min_weight_version=0, max_weight_version=0, size_bytes=len(data), arrow_ipc=data,
    )  # fmt: skip


def claim_check(batch_id: str, path: Path, sha256: str | None = None) -> TrajectoryBatch:
    data = path.read_bytes()
    return TrajectoryBatch(
        batch_id=batch_id, step=0, num_rows=12, num_groups=2, num_sessions=6, builder="per_request",
        min_weight_version=0, max_weight_version=0, size_bytes=len(data), uri=path.as_uri(),
        sha256=sha256 or hashlib.sha256(data).hexdigest(),
    )  # fmt: skip


async def wait_for_versions(consumer: Consumer[Any], want: int, timeout_s: float) -> list[WeightsPublished]:
    seen: list[WeightsPublished] = []
    deadline = time.monotonic() + timeout_s
    while not any(w.version >= want for w in seen):
        assert time.monotonic() < deadline, f"no version {want} within {timeout_s}s; saw {[w.version for w in seen]}"
        msg = await consumer.next(timeout_s=0.5)
        if msg is not None:
            seen.append(msg.event)
    return seen


async def test_serve_trains_publishes_and_skips_redelivered_batches(
    tiny_model_dir, tmp_path, kafka_settings, topic_factory, consumer_group
):
    batches_topic, weights_topic = topic_factory(TRAJECTORY_BATCHES), topic_factory(WEIGHTS)
    settings = LearnerSettings(
        model_dir=tiny_model_dir, checkpoint_dir=tmp_path / "ckpt", trajectory_batches_topic=batches_topic.name,
        weights_topic=weights_topic.name, group_id=consumer_group, max_staleness=None, **LINEAR,
    )  # fmt: skip
    # max_staleness=None: the synthetic rows are all sampled by v0, and the rejected batches' versions make b3 stale.
    data = make_batches(3)
    big = tmp_path / "b2.arrow"
    big.write_bytes(data[1])
    bad_id = f"bad-{uuid.uuid4().hex[:8]}"
    async with Producer(kafka_settings) as producer:
        await producer.send(batches_topic, inline("b1", data[0]))
        await producer.send(batches_topic, claim_check("b2", big))
        await producer.send(batches_topic, inline("b1", data[0]))  # a redelivery of b1
        await producer.send(batches_topic, claim_check(bad_id, big, sha256="0" * 64))  # corrupt claim check
        await producer.send(batches_topic, inline(bad_id + "-arrow", b"not an arrow stream"))  # undecodable rows
        await producer.send(batches_topic, inline("b3", data[2]))

    stop = asyncio.Event()
    task = asyncio.create_task(serve(settings, stop, kafka_settings))
    async with Consumer(kafka_settings, [weights_topic], group_id=consumer_group + "-w") as weights:
        seen = await wait_for_versions(weights, 5, timeout_s=120)
        # No version for the redelivery; a version with unchanged weights for each rejected batch (the rollout's
        # lag bound counts one version per batch it published).
        assert [w.version for w in seen] == [1, 2, 3, 4, 5]
        assert [w.batch_id for w in seen] == ["b1", "b2", bad_id, bad_id + "-arrow", "b3"]
        assert [w.step for w in seen] == [1, 2, 2, 2, 3]
        assert all(w.base_model == "policy" for w in seen)
        assert ["loss" in w.metrics for w in seen] == [True, True, False, False, True]
        assert [w.metrics.get("batch_rejected") for w in seen] == [None, None, 1.0, 1.0, None]
        # The learner's own clock: every step took time, and it was never busier than the time since the first batch.
        for w in seen:
            m = w.metrics
            assert m["learner_step_s"] > 0 and m["learner_wait_s"] >= 0
            assert 0 < m["learner_busy_s"] <= m["learner_window_s"] and 0 < m["learner_busy_fraction"] <= 1
        assert seen[0].metrics["learner_wait_s"] == 0  # nothing was waited for before the first batch
        stop.set()
        await asyncio.wait_for(task, 60)
        state = read_state(Path(seen[-1].uri))
        assert state.applied_batches == ["b1", "b2", bad_id, bad_id + "-arrow", "b3"]
        assert load_file(str(Path(seen[-1].uri) / "model.safetensors"))  # a loadable weights file

        # A restart re-announces the version it resumed from (covers a crash between checkpoint and publish).
        stop2 = asyncio.Event()
        task2 = asyncio.create_task(serve(settings, stop2, kafka_settings))
        again = await wait_for_versions(weights, 5, timeout_s=120)
        assert again[-1].version == 5 and again[-1].uri == seen[-1].uri
        stop2.set()
        await asyncio.wait_for(task2, 60)

    async with Consumer(kafka_settings, [DEAD_LETTER], group_id=consumer_group + "-dlq") as dlq:
        deadline = time.monotonic() + 30
        found = None
        while found is None and time.monotonic() < deadline:
            msg = await dlq.next(timeout_s=0.5)
            if msg is not None and msg.event.key == bad_id:
                found = msg.event
        assert found is not None, "the corrupt claim check was dead-lettered"
        assert found.error_type == "BatchError" and "sha256 mismatch" in found.reason
        assert json.loads(base64.b64decode(found.value_b64))["batch_id"] == bad_id
        found_arrow = None
        while found_arrow is None and time.monotonic() < deadline:
            msg = await dlq.next(timeout_s=0.5)
            if msg is not None and msg.event.key == bad_id + "-arrow":
                found_arrow = msg.event
        assert found_arrow is not None and found_arrow.error_type == "DecodeError"


@pytest.mark.slow
async def test_a_step_longer_than_max_step_s_costs_a_redelivery_not_a_crash(
    tiny_model_dir, tmp_path, kafka_settings, topic_factory, consumer_group
):
    # The group drops a member that does not poll for max_step_s, so the commit after such a step fails
    # (UNKNOWN_MEMBER_ID); the learner must carry on, and the ledger skips the batch when it comes again.
    batches_topic, weights_topic = topic_factory(TRAJECTORY_BATCHES), topic_factory(WEIGHTS)
    settings = LearnerSettings(
        model_dir=tiny_model_dir, checkpoint_dir=tmp_path / "ckpt", trajectory_batches_topic=batches_topic.name,
        weights_topic=weights_topic.name, group_id=consumer_group, max_step_s=10, debug_step_delay_s=13, **LINEAR,
    )  # fmt: skip
    data = make_batches(2, seed=5)
    async with Producer(kafka_settings) as producer:
        await producer.send(batches_topic, inline("s1", data[0]))
        await producer.send(batches_topic, inline("s2", data[1]))
    stop = asyncio.Event()
    task = asyncio.create_task(serve(settings, stop, kafka_settings))
    try:
        async with Consumer(kafka_settings, [weights_topic], group_id=consumer_group + "-w") as weights:
            seen = await wait_for_versions(weights, 2, timeout_s=150)
        assert not task.done(), task.exception()
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)
    assert [w.version for w in seen] == [1, 2]
    assert read_state(Path(seen[-1].uri)).applied_batches == ["s1", "s2"]


def _spawn(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as f:
        return subprocess.Popen([sys.executable, "-m", "learner"], env=env, stdout=f, stderr=f, start_new_session=True)


def _log_events(log: Path) -> list[dict[str, Any]]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


async def _wait_log(log: Path, proc: subprocess.Popen[bytes], pred: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not any(pred(e) for e in _log_events(log)):
        assert proc.poll() is None, f"learner exited early:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"condition not met in {timeout_s}s:\n{log.read_text()[-3000:]}"
        await asyncio.sleep(0.2)


@pytest.mark.slow
async def test_kill_minus_9_during_a_step_resumes_without_applying_any_batch_twice(
    tiny_model_dir, tmp_path, kafka_settings, topic_factory, consumer_group
):
    batches_topic, weights_topic = topic_factory(TRAJECTORY_BATCHES), topic_factory(WEIGHTS)
    data = make_batches(4, seed=3)
    ids = [f"c{i}" for i in range(4)]
    async with Producer(kafka_settings) as producer:
        for batch_id, d in zip(ids, data, strict=True):
            await producer.send(batches_topic, inline(batch_id, d))

    ckpt = tmp_path / "ckpt"
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "FLOE_KAFKA_BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers,
        "FLOE_LEARNER_MODEL_DIR": str(tiny_model_dir),
        "FLOE_LEARNER_CHECKPOINT_DIR": str(ckpt),
        "FLOE_LEARNER_TRAJECTORY_BATCHES_TOPIC": batches_topic.name,
        "FLOE_LEARNER_WEIGHTS_TOPIC": weights_topic.name,
        "FLOE_LEARNER_GROUP_ID": consumer_group,
        "FLOE_LEARNER_DEBUG_STEP_DELAY_S": "1.5",  # each step sleeps after backward: the kill lands mid-step
        **{f"FLOE_LEARNER_{k.upper()}": str(v) for k, v in LINEAR.items()},
    }
    log1, log2 = tmp_path / "run1.log", tmp_path / "run2.log"
    proc = _spawn(env, log1)
    try:
        await _wait_log(log1, proc, lambda e: e.get("event") == "train step started" and e.get("step") == 3, 180)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL
    at_crash = latest_checkpoint(ckpt)
    assert at_crash is not None and at_crash.name == "v00000002", "killed during step 3, before its checkpoint"
    assert read_state(at_crash).applied_batches == ["c0", "c1"]

    proc2 = _spawn(env, log2)
    try:
        async with Consumer(kafka_settings, [weights_topic], group_id=consumer_group + "-w") as weights:
            seen = await wait_for_versions(weights, 4, timeout_s=240)
        proc2.send_signal(signal.SIGTERM)  # graceful stop
        proc2.wait(timeout=60)
    finally:
        if proc2.poll() is None:
            os.killpg(proc2.pid, signal.SIGKILL)
    assert proc2.returncode == 0, log2.read_text()[-3000:]

    versions = [w.version for w in seen]
    assert sorted(set(versions)) == [1, 2, 3, 4], versions  # same numbering across the crash, no gap
    assert versions == sorted(versions), "versions never go backwards"
    final = latest_checkpoint(ckpt)
    assert final is not None and final.name == "v00000004"
    assert read_state(final).applied_batches == ids  # each batch exactly once, in order
    started = [e["batch_id"] for e in _log_events(log2) if e.get("event") == "train step started"]
    assert started == ["c2", "c3"], started  # the run after the crash re-trained only the interrupted batch onward
    resumed = [e for e in _log_events(log2) if e.get("event") == "learner ready"]
    assert resumed and resumed[0]["version"] == 2

    # The crashed-and-resumed run ends with the same weights as an uninterrupted run on the same batches.
    files = []
    for batch_id, d in zip(ids, data, strict=True):
        (tmp_path / f"{batch_id}.arrow").write_bytes(d)
        files.append(tmp_path / f"{batch_id}.arrow")
    ref = train_files(LearnerSettings(model_dir=tiny_model_dir, checkpoint_dir=tmp_path / "ref", **LINEAR), files)
    a, b = load_file(str(final / "model.safetensors")), load_file(str(ref[-1].checkpoint / "model.safetensors"))
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6, msg=k)
