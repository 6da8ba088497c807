"""Several instances of each scalable service in one run, one of each killed in turn, and the topics stay exact.

A toy ``floe demo`` runs with 3 rollout instances, 2 gateway nodes, 2 scorer instances and a 2-rank learner
(``torchrun``, gloo on CPU) over one real Kafka broker. Both nodes, both scorers and at least two rollout shards
must do work first; then, each only after training has made progress since the previous fault:

- ``kill -9`` of gateway node 2, not restarted: its partitions of ``floe.sessions.requested`` go to node 1, which
  runs every session requested from then on; the sessions that died with node 2 are ended by the rollout's group
  deadline and kept as masked rows;
- ``kill -9`` of scorer 2, not restarted: scorer 1 takes its partitions, and a session finished but not yet graded
  there is graded once (its reward is produced in the transaction that commits its input offset);
- ``kill -9`` of learner rank 1: torchrun's agent tears the worker group down and starts it again; the ranks resume
  from the last checkpoint and the ledger skips a batch already trained;
- ``kill -9`` of the rollout leader, not restarted: another instance takes ``floe.rollout.groups`` and leads (its
  /state says so), the two survivors share the dead one's partitions, and training goes on.

At the end ``floe.audit`` must find no trajectory lost or duplicated, no duplicate reward, no batch trained twice,
and every group admitted before the node was killed batched. The dashboard follows the same topics on the other
Kafka client, aiokafka (the services use confluent-kafka): it must have seen every weight version the audit found
and at least as many rewards. The run directory is kept on a failure (``FLOE_E2E_KEEP=1``: always).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from contracts import SESSIONS_FINISHED, SESSIONS_REQUESTED, SessionFinished, SessionRequested
from eventbus import EventBusError, KafkaSettings
from eventbus.replay import replay
from eventbus.testing import newest_weight_version
from floe.audit import AuditReport, audit
from floe.demo import Demo

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.scale]

ROLLOUTS = ("rollout", "rollout-2", "rollout-3")
STEP_TIMEOUT_S = 180.0  # per wait for training progress: a restart and a step with every service doubled, on 2 cores


class Run:
    def __init__(self, demo: Demo) -> None:
        self.demo = demo
        self.t0 = time.monotonic()
        self.log: list[str] = []
        self.killed: set[str] = set()

    @property
    def stack(self):  # type: ignore[no-untyped-def]
        assert self.demo.stack is not None
        return self.demo.stack

    def say(self, msg: str) -> None:
        line = f"[{time.monotonic() - self.t0:6.1f}s] {msg}"
        self.log.append(line)
        print(line, flush=True)

    def wait_until(self, what: str, cond: Callable[[], bool], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            dead = [name for name in self.stack.dead() if name not in self.killed]
            if dead:
                raise AssertionError(f"while waiting for {what}: service(s) died: {dead}")
            if cond():
                return
            time.sleep(1.0)
        raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")

    def version(self) -> int:
        try:
            return newest_weight_version(self.demo.kafka)
        except EventBusError:
            return -1

    def wait_version(self, at_least: int) -> int:
        seen = [0]

        def reached() -> bool:
            seen[0] = self.version()
            return seen[0] >= at_least

        self.wait_until(f"weights version >= {at_least}", reached, STEP_TIMEOUT_S)
        self.say(f"weights version {seen[0]}")
        return seen[0]

    def log_size(self, name: str) -> int:
        return (self.stack.logs / f"{name}.log").stat().st_size

    def log_count(self, name: str, text: str, since: int = 0) -> int:
        with (self.stack.logs / f"{name}.log").open("rb") as fh:
            fh.seek(since)
            return fh.read().count(text.encode())

    def kill(self, name: str) -> None:
        self.say(f"kill -9 {name} (pid {self.stack.pid(name)}), not restarted")
        self.killed.add(name)
        self.stack.kill(name)

    def tails(self) -> str:
        names = (*ROLLOUTS, "scorer", "scorer-2", "learner", "gateway", "gateway-2", "inference", "dashboard")
        return "\n".join(f"----- {n}.log (tail)\n{self.stack.tail(n, 40)}" for n in names)


def _finished(kafka: KafkaSettings) -> list[SessionFinished]:
    return [
        r.event for r in replay(kafka, SESSIONS_FINISHED, idle_timeout_s=3.0) if isinstance(r.event, SessionFinished)
    ]


def _requested(kafka: KafkaSettings) -> list[SessionRequested]:
    return [
        r.event for r in replay(kafka, SESSIONS_REQUESTED, idle_timeout_s=3.0) if isinstance(r.event, SessionRequested)
    ]


def _dashboard_agrees(run: Run, report: AuditReport) -> None:
    """The dashboard (aiokafka, read_committed) saw what the audit (confluent-kafka) found: every weight version up to
    the audit's newest, no other, and at least the rewards the audit counted (the run goes on meanwhile)."""
    url = f"http://127.0.0.1:{run.demo.ports['dashboard']}/api/state"
    assert '"client": "aiokafka"' in (run.stack.logs / "dashboard.log").read_text(), run.stack.tail("dashboard")
    newest = report.versions[-1]
    state: dict[str, Any] = {}

    def caught_up() -> bool:
        nonlocal state
        state = httpx.get(url, timeout=10).json()
        return int(state["weight_version"] or 0) >= newest

    run.wait_until(f"the dashboard to see weights version {newest}", caught_up, 60)
    seen = {int(w["version"]) for w in state["learner"] if int(w["version"]) <= newest}
    assert seen == set(report.versions), (sorted(seen), report.versions)
    assert state["rewards_seen"] >= report.counts["sessions rewarded"], state["rewards_seen"]


def _rollout_leaders(run: Run) -> list[str]:
    """The rollout instances whose /state says they lead (exactly one, once the group has settled)."""
    out = []
    for name in ROLLOUTS:
        if name in run.killed:
            continue
        state = httpx.get(f"http://127.0.0.1:{run.demo.ports[name]}/state", timeout=10).json()
        if state.get("leader"):
            out.append(name)
    return out


def _worker_of_rank(agent_pid: int, rank: int) -> int:
    """The pid of torchrun's worker process with ``RANK=rank`` (a child of the agent)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid != agent_pid:
                continue
            env = dict(e.split("=", 1) for e in (proc / "environ").read_text().split("\0") if "=" in e)
        except (OSError, ValueError):
            continue
        if env.get("RANK") == str(rank):
            return int(proc.name)
    raise AssertionError(f"no worker of rank {rank} under torchrun (pid {agent_pid})")


@pytest.fixture
def demo(toy_demo: Callable[..., Demo]) -> Demo:
    return toy_demo("floe-e2e-scale-", gateway_nodes=2, scorers=2, learner_ranks=2, rollouts=3, dashboard=True)


def test_two_of_everything_lose_one_each_and_topics_stay_exact(demo: Demo) -> None:
    run = Run(demo)
    try:
        _scenario(run)
    except BaseException:
        print("\n".join(run.log))
        print(run.tails())
        raise


def _scenario(run: Run) -> None:
    kafka = run.demo.kafka
    v = run.wait_version(1)
    assert run.log_count("learner", '"world_size": 2') >= 1, run.stack.tail("learner")

    # Both nodes run sessions and both scorers grade them before anything is killed.
    run.wait_until(
        "sessions finished on both gateway nodes",
        lambda: {f.node_id for f in _finished(kafka)} >= {"demo-node-1", "demo-node-2"},
        STEP_TIMEOUT_S,
    )
    run.wait_until(
        "both scorers grading",
        lambda: all(run.log_count(n, '"session scored"') > 0 for n in ("scorer", "scorer-2")),
        STEP_TIMEOUT_S,
    )
    run.wait_until(
        "two rollout shards assembling groups",
        lambda: sum(run.log_count(n, '"group assembled"') > 0 for n in ROLLOUTS) >= 2,
        STEP_TIMEOUT_S,
    )

    killed_at_ms = int(time.time() * 1000)
    run.kill("gateway-2")

    def late_finished() -> dict[str, str]:
        """Node of each session requested after the kill and finished so far."""
        late = {r.session_id for r in _requested(kafka) if r.requested_at > killed_at_ms}
        return {f.session_id: f.node_id for f in _finished(kafka) if f.session_id in late}

    # The pipeline runs ahead of the learner (lag bound), so versions alone do not show that sessions still run:
    # wait for two groups' worth of sessions requested after the kill.
    run.wait_until("sessions requested after the kill to finish", lambda: len(late_finished()) >= 8, STEP_TIMEOUT_S)
    v = run.wait_version(v + 1)
    run.kill("scorer-2")
    v = run.wait_version(v + 2)

    since = run.log_size("learner")
    agent = run.stack.pid("learner")
    worker = _worker_of_rank(agent, 1)
    run.say(f"kill -9 learner rank 1 (pid {worker}); torchrun restarts the worker group")
    os.kill(worker, signal.SIGKILL)
    run.wait_until(
        "both ranks ready again",
        lambda: run.log_count("learner", '"learner ready"', since) >= 2,
        STEP_TIMEOUT_S,
    )
    assert run.stack.alive("learner"), "torchrun's agent gave up instead of restarting the ranks"
    v = run.wait_version(v + 1)

    leaders = _rollout_leaders(run)
    assert len(leaders) == 1, leaders
    run.kill(leaders[0])
    run.wait_until("another rollout instance to lead", lambda: len(_rollout_leaders(run)) == 1, STEP_TIMEOUT_S)
    run.say(f"{_rollout_leaders(run)[0]} leads")
    v = run.wait_version(v + 2)

    before = {r.group_id for r in _requested(kafka) if r.requested_at <= killed_at_ms}
    report: AuditReport | None = None

    def settled() -> bool:
        nonlocal report
        report = audit(kafka, idle_timeout=3.0)
        return not (before & set(report.unbatched_groups))

    try:
        run.wait_until(f"the {len(before)} groups requested before the node kill to be batched", settled, 180)
    finally:
        if report is not None:
            print(report.table())
    assert report is not None
    assert report.ok, report.violations
    assert report.versions[-1] >= v
    # Node 1 ran every session requested after node 2 died (once the group gave it node 2's partitions); one that
    # waited past its group's deadline in a dead node's partition was ended by the rollout ("rollout").
    _dashboard_agrees(run, report)
    nodes = set(late_finished().values())
    assert "demo-node-1" in nodes and nodes <= {"demo-node-1", "rollout"}, nodes
    run.say(f"done: {len(report.versions)} versions, {report.counts['trajectory batches']} batches, audit clean")
    run.demo.passed = True  # type: ignore[attr-defined]
