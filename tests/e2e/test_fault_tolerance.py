"""Fault tolerance of the main job, end to end: crash every service once during a real demo run and audit the topics.

A toy ``floe demo`` runs (real Kafka broker, every service its own process). One fault at a time, each only after
training has made progress since the previous one: ``kill -9`` + restart of the rollout service, the scorer, the
learner and the gateway node, then a stop/start of the Kafka broker. After each fault training must go on (new
``WeightsPublished`` versions), and at the end ``floe.audit`` must find no trajectory lost or duplicated, no
duplicate reward and no batch trained twice; every group admitted before the gateway was killed must have been
batched (its sessions on the dead node are ended by the rollout's group deadline and kept as masked rows).

Everything waits on conditions with deadlines; on a failure the tails of the service logs are printed and the run
directory (logs, broker data) is kept; ``FLOE_E2E_KEEP=1`` keeps it after a pass too.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from contracts import SESSIONS_REQUESTED, SessionRequested
from eventbus import EventBusError, KafkaSettings
from eventbus.replay import replay
from eventbus.testing import newest_weight_version
from floe.audit import AuditReport, audit
from floe.demo import Demo

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STEP_TIMEOUT_S = 150.0  # per wait for training progress (a restart + a step, on a busy 2-core machine)


class Run:
    def __init__(self, demo: Demo) -> None:
        self.demo = demo
        self.t0 = time.monotonic()
        self.log: list[str] = []

    @property
    def stack(self):  # type: ignore[no-untyped-def]
        assert self.demo.stack is not None
        return self.demo.stack

    def say(self, msg: str) -> None:
        line = f"[{time.monotonic() - self.t0:6.1f}s] {msg}"
        self.log.append(line)
        print(line, flush=True)

    def version(self) -> int:
        try:
            return newest_weight_version(self.demo.kafka)
        except EventBusError:
            return -1  # broker restarting: not an answer

    def wait_until(self, what: str, cond: Callable[[], bool], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            dead = self.stack.dead()
            if dead:
                raise AssertionError(f"while waiting for {what}: service(s) died: {dead}")
            if cond():
                return
            time.sleep(1.0)
        raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")

    def wait_version(self, at_least: int) -> int:
        seen = [0]

        def reached() -> bool:
            seen[0] = self.version()
            return seen[0] >= at_least

        self.wait_until(f"weights version >= {at_least}", reached, STEP_TIMEOUT_S)
        self.say(f"weights version {seen[0]}")
        return seen[0]

    def wait_log(self, name: str, text: str, since: int, timeout_s: float = 120.0) -> None:
        path = self.stack.logs / f"{name}.log"

        def found() -> bool:
            with path.open("rb") as fh:
                fh.seek(since)
                return text.encode() in fh.read()

        self.wait_until(f"{name} log line {text!r}", found, timeout_s)

    def crash_and_restart(self, name: str, ready_line: str | None = None) -> None:
        path = self.stack.logs / f"{name}.log"
        since = path.stat().st_size
        pid = self.stack.pid(name)
        self.say(f"kill -9 {name} (pid {pid})")
        self.stack.restart(name)  # SIGKILL to its process group, then start; waits for its /health if it has one
        if ready_line:
            self.wait_log(name, ready_line, since)
        self.say(f"{name} restarted (pid {self.stack.pid(name)})")

    def tails(self) -> str:
        out = []
        for name in ("rollout", "scorer", "learner", "gateway", "inference"):
            out.append(f"----- {name}.log (tail)\n{self.stack.tail(name, 40)}")
        return "\n".join(out)


def _groups_requested_before(kafka: KafkaSettings, at_ms: int) -> set[str]:
    groups = set()
    for record in replay(kafka, SESSIONS_REQUESTED, idle_timeout_s=3.0):
        event = record.event
        if isinstance(event, SessionRequested) and event.requested_at <= at_ms:
            groups.add(event.group_id)
    return groups


@pytest.fixture
def demo(toy_demo: Callable[..., Demo]) -> Demo:
    return toy_demo("floe-e2e-")


def test_training_survives_crashes_and_topics_stay_exact(demo: Demo) -> None:
    run = Run(demo)
    try:
        _faults(run)
    except BaseException:
        print("\n".join(run.log))
        print(run.tails())
        raise


def _faults(run: Run) -> None:
    kafka = run.demo.kafka
    v = run.wait_version(1)

    for name, ready_line in (
        ("rollout", "rollout service ready"),  # after its state is rebuilt from the topics
        ("scorer", "scorer consuming"),
        ("learner", "learner ready"),
    ):
        run.crash_and_restart(name, ready_line)
        v = run.wait_version(v + 1)

    # The gateway node runs the sessions: the ones in flight die with it and never get a terminal state.
    killed_at_ms = int(time.time() * 1000)
    run.crash_and_restart("gateway")
    v = run.wait_version(v + 1)

    run.say("restarting the Kafka broker")
    run.demo.restart_broker()
    run.say("broker back")
    v = run.wait_version(v + 1)

    # Every group admitted before the gateway died must end up in a batch (masked rows for the dead sessions).
    before = _groups_requested_before(kafka, killed_at_ms)
    report: AuditReport | None = None

    def settled() -> bool:
        nonlocal report
        report = audit(kafka, idle_timeout=3.0)
        return not (before & set(report.unbatched_groups))

    try:
        run.wait_until(f"the {len(before)} groups requested before the gateway kill to be batched", settled, 180)
    finally:
        if report is not None:
            print(report.table())
    assert report is not None
    assert report.ok, report.violations
    assert report.versions[-1] >= v
    assert report.counts["batches trained"] >= 5
    run.say(f"done: {len(report.versions)} versions, {report.counts['trajectory batches']} batches, audit clean")
    run.demo.passed = True  # type: ignore[attr-defined]
