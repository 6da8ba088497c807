"""Services on hosts of their own, two of them cut off the network, and the topics stay exact.

A toy ``floe demo`` with 2 gateway nodes runs with every service (and the broker) in a network namespace of its own
(``floe.hosts``: its own 10.x address on one switch; the test process reaches them as the switch's ``.1``). Then:

- gateway node 2's host is cut off for longer than the session timeout. The group coordinator drops node 2 after
  the consumer session timeout (10 s) and gives its partitions to node 1; node 2's sessions cannot reach the engine
  and end by the rules of docs/scaling.md ("A host cut off the network"): the rollout cancels them at their group's
  deadline and, when no end comes back within the cancel grace, ends them itself (CANCELLED, kept as masked rows).
  Whatever node 2 publishes after the restore comes second, and every consumer keeps the first end;
- the broker's host is cut off for 30 s: every service waits and carries on by itself once it is back.

At the end ``floe.audit`` must find no trajectory lost or duplicated, no duplicate reward, no batch trained twice, and
every group requested before the broker was cut batched; training must have gone on after both restores. No
namespace, link, process or sandbox may be left behind.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from contracts import SESSIONS_FINISHED, SESSIONS_REQUESTED, SessionFinished, SessionRequested
from eventbus import EventBusError
from eventbus.replay import replay
from eventbus.testing import newest_weight_version
from floe.audit import AuditReport, audit
from floe.demo import Demo
from floe.hosts import Network, leftovers

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.scale]

SESSION_TIMEOUT_S = 40.0
NODE_CUT_S = 55.0  # longer than the session timeout
BROKER_CUT_S = 30.0
STEP_TIMEOUT_S = 180.0
HOSTS = ["kafka", "inference", "gateway", "gateway-2", "scorer", "learner", "rollout"]


class Run:
    def __init__(self, demo: Demo, net: Network) -> None:
        self.demo, self.net = demo, net
        self.t0 = time.monotonic()
        self.log: list[str] = []

    def say(self, msg: str) -> None:
        line = f"[{time.monotonic() - self.t0:6.1f}s] {msg}"
        self.log.append(line)
        print(line, flush=True)

    def wait_until(self, what: str, cond: Callable[[], bool], timeout_s: float) -> None:
        assert self.demo.stack is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            dead = self.demo.stack.dead()
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

    def cut_for(self, name: str, seconds: float) -> None:
        self.say(f"cut {name} ({self.net[name].address}) off the network for {seconds:.0f}s")
        self.net.cut(name)
        try:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                assert self.demo.stack is not None
                dead = self.demo.stack.dead()
                assert not dead, f"service(s) died while {name} was cut off: {dead}"
                time.sleep(1.0)
        finally:
            self.net.restore(name)
        self.say(f"{name} restored")

    def tails(self) -> str:
        assert self.demo.stack is not None
        names = ("rollout", "scorer", "learner", "gateway", "gateway-2", "inference")
        return "\n".join(f"----- {n}.log (tail)\n{self.demo.stack.tail(n, 40)}" for n in names)


def _finished(demo: Demo) -> list[SessionFinished]:
    records = replay(demo.kafka, SESSIONS_FINISHED, idle_timeout_s=3.0)
    return [r.event for r in records if isinstance(r.event, SessionFinished)]


def _requested(demo: Demo) -> list[SessionRequested]:
    records = replay(demo.kafka, SESSIONS_REQUESTED, idle_timeout_s=3.0)
    return [r.event for r in records if isinstance(r.event, SessionRequested)]


@pytest.fixture
def network() -> Iterator[Network]:
    with Network(HOSTS) as net:
        network_id = net.id
        yield net
    assert not leftovers(network_id), leftovers(network_id)


@pytest.fixture
def placed(network: Network, toy_demo: Callable[..., Demo]) -> tuple[Demo, Network]:
    # ``network`` is set up first, so it is torn down last: after the demo stopped its services and the broker.
    demo = toy_demo("floe-e2e-hosts-", hosts=network.hosts, gateway_nodes=2, session_timeout_s=SESSION_TIMEOUT_S)
    return demo, network


def test_a_node_and_the_broker_cut_off_the_network_lose_nothing(placed: tuple[Demo, Network]) -> None:
    demo, net = placed
    run = Run(demo, net)
    try:
        _scenario(run)
    except BaseException:
        print("\n".join(run.log))
        print(run.tails())
        raise


def _scenario(run: Run) -> None:
    demo, net = run.demo, run.net
    assert demo.stack is not None
    # Traffic stays on the addresses the test created: the clients' broker address is the broker host's, and each
    # service runs in its own host's namespace (whose only interfaces are its loopback and its link to the switch).
    assert demo.kafka.bootstrap_servers.split(":")[0] == net["kafka"].address
    for name in HOSTS[1:]:
        assert demo.stack.pid(name) in net.pids(name), f"{name} does not run on its host"

    v = run.wait_version(1)
    run.wait_until(
        "sessions finished on both gateway nodes",
        lambda: {f.node_id for f in _finished(demo)} >= {"demo-node-1", "demo-node-2"},
        STEP_TIMEOUT_S,
    )

    cut_at_ms = int(time.time() * 1000)
    run.cut_for("gateway-2", NODE_CUT_S)
    # Node 1 ran sessions requested while node 2 was away (it got node 2's partitions), and training went on.
    restored_ms = int(time.time() * 1000)
    during = {r.session_id for r in _requested(demo) if cut_at_ms + 15_000 < r.requested_at < restored_ms}
    v = run.wait_version(v + 2)
    finished = _finished(demo)
    assert {f.node_id for f in finished if f.session_id in during} & {"demo-node-1"}, "node 1 took over nothing"

    before_broker_cut = {r.group_id for r in _requested(demo)}
    run.cut_for("kafka", BROKER_CUT_S)
    v = run.wait_version(v + 2)

    report: AuditReport | None = None

    def settled() -> bool:
        nonlocal report
        report = audit(demo.kafka, idle_timeout=3.0)
        return not (before_broker_cut & set(report.unbatched_groups))

    try:
        run.wait_until(
            f"the {len(before_broker_cut)} groups requested before the broker cut to be batched", settled, 180
        )
    finally:
        if report is not None:
            print(report.table())
    assert report is not None
    assert report.ok, report.violations
    # Each session's first end is the one that counts; node 2's sessions that the cut stranded were ended by the
    # rollout or by node 2 itself (its session timeout), never left open.
    first: dict[str, SessionFinished] = {}
    for f in _finished(demo):
        first.setdefault(f.session_id, f)
    stranded = [f for f in first.values() if f.node_id == "rollout"]
    run.say(
        f"done: {len(report.versions)} versions, {report.counts['trajectory batches']} batches, "
        f"{len(stranded)} sessions ended by the rollout, audit clean"
    )
    demo.passed = True  # type: ignore[attr-defined]
