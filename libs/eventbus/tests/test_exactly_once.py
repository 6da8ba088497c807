"""Exactly-once consume -> produce across a real process kill (SIGKILL in the middle of a transaction).

The stage (``eos_stage.py``) runs as a subprocess. The first incarnation flushes each transaction's outputs to the
log and pauses before committing; the test SIGKILLs it during its second transaction. A second incarnation with the
same transactional id fences the first, its open transaction is aborted, and it re-processes from the committed
offsets. A ``read_committed`` reader must then see every output exactly once, while a ``read_uncommitted`` reader
proves the aborted outputs really were written (so the kill did land mid-transaction).

``FLOE_EOS_RUNS=5`` repeats the scenario (the issue asks for five runs in a row).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest

from contracts import REWARDS, SESSIONS_FINISHED, RewardPublished, SessionFinished, SessionState, Topic, decode
from eventbus import KafkaSettings, Producer

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STAGE = Path(__file__).with_name("eos_stage.py")
N = 120
RUNS = int(os.environ.get("FLOE_EOS_RUNS", "1"))


def start_stage(
    settings: KafkaSettings, inp: str, out: str, group: str, txn_id: str, hang_at_txn: int
) -> subprocess.Popen[str]:
    cmd = [
        sys.executable,
        str(STAGE),
        "--bootstrap",
        settings.bootstrap_servers,
        "--input",
        inp,
        "--output",
        out,
        "--group",
        group,
        "--txn-id",
        txn_id,
        "--max-batch",
        "20",
        "--hang-at-txn",
        str(hang_at_txn),
    ]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _close_pipes(proc: subprocess.Popen[str]) -> None:
    # Left to the garbage collector, the pipes of a killed stage raise a ResourceWarning whenever it runs, which
    # (warnings are errors here) failed an unrelated later assertion point under load.
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


def wait_line(proc: subprocess.Popen[str], prefix: str, timeout_s: float, nth: int = 1) -> list[str]:
    """Read the stage's stdout until the ``nth`` line starting with ``prefix`` (fail on exit or deadline)."""
    import selectors

    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    seen: list[str] = []
    hits = 0
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
            break
        line = proc.stdout.readline()
        if not line:
            err = proc.stderr.read() if proc.stderr else ""
            pytest.fail(
                f"stage exited (rc={proc.wait()}) before {prefix!r}; stdout={seen}; stderr tail:\n{err[-3000:]}"
            )
        seen.append(line.strip())
        if line.startswith(prefix):
            hits += 1
            if hits == nth:
                return seen
    pytest.fail(f"no {prefix!r} #{nth} within {timeout_s}s; stdout so far: {seen}")


def read_all(settings: KafkaSettings, topic: str, isolation: str, expect_at_least: int, timeout_s: float) -> list[str]:
    """Session ids on ``topic`` (group-less, from the beginning) until the partition ends are reached."""
    c = confluent_kafka.Consumer(
        {
            **settings.as_librdkafka(),
            "group.id": f"check-{uuid.uuid4().hex}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        meta = c.list_topics(topic, timeout=10).topics[topic]
        tps = [confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING) for p in meta.partitions]
        c.assign(tps)
        ids: list[str] = []
        deadline = time.monotonic() + timeout_s
        quiet_until = None
        while time.monotonic() < deadline:
            msg = c.poll(0.2)
            if msg is None:
                if len(ids) >= expect_at_least:
                    quiet_until = quiet_until or time.monotonic() + 1.0
                    if time.monotonic() > quiet_until:
                        break
                continue
            assert msg.error() is None, msg.error()
            ids.append(decode(RewardPublished, msg.value() or b"").session_id)
            quiet_until = None
        return ids
    finally:
        c.close()


@pytest.mark.parametrize("run", range(RUNS))
async def test_killed_stage_restarts_and_outputs_every_event_exactly_once(
    run: int, kafka_settings: KafkaSettings, topic_factory: Callable[..., Topic[Any]], consumer_group: str
) -> None:
    inp = topic_factory(SESSIONS_FINISHED, partitions=3)
    out = topic_factory(REWARDS, partitions=3)
    txn_id = f"eos-stage-{uuid.uuid4().hex[:8]}"
    async with Producer(kafka_settings) as producer:
        for i in range(N):
            await producer.send(
                inp,
                SessionFinished(
                    session_id=f"s-{i:04d}",
                    group_id="g",
                    task_id="t",
                    harness="pi",
                    node_id="n",
                    status=SessionState.DONE,
                ),
            )

    first = start_stage(kafka_settings, inp.name, out.name, consumer_group, txn_id, hang_at_txn=3)
    try:
        # Transactions 1 and 2 commit; the third writes its outputs and hangs before committing: kill it there.
        lines = wait_line(first, "IN_TXN", timeout_s=60)
        assert sum(line.startswith("COMMITTED") for line in lines) == 2, lines
        first.send_signal(signal.SIGKILL)
        assert first.wait(timeout=10) == -signal.SIGKILL
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
        _close_pipes(first)

    second = start_stage(kafka_settings, inp.name, out.name, consumer_group, txn_id, hang_at_txn=0)
    try:
        wait_line(second, "READY", timeout_s=60)
        committed = read_all(kafka_settings, out.name, "read_committed", N, timeout_s=60)
    finally:
        second.send_signal(signal.SIGTERM)
        try:
            second.wait(timeout=20)
        except subprocess.TimeoutExpired:
            second.kill()
            second.wait()
        _close_pipes(second)

    counts = Counter(committed)
    duplicates = {k: v for k, v in counts.items() if v > 1}
    assert not duplicates, f"duplicated outputs: {duplicates}"
    assert set(counts) == {f"s-{i:04d}" for i in range(N)}, f"missing: {N - len(counts)}"
    # The killed transaction's outputs were physically written (then aborted): the kill was mid-transaction.
    everything = read_all(kafka_settings, out.name, "read_uncommitted", N + 1, timeout_s=30)
    assert len(everything) > N, "the killed transaction wrote nothing; the test did not kill mid-transaction"
