"""How far one rollout instance goes, and how several share the load: a load generator against the real rollout.

    .venv/bin/python bench/rollout_load/run.py [--groups 48] [--group-size 4] [--rates 0,100,400] [--instances 1,2,3]

The rollout's builder alone folds thousands of calls per second (``bench/rollout``); what a deployment needs is the
rate one *instance* sustains through everything it does per event: consume from Kafka (read_committed), decode the
contract, fold the call into its session's trajectory, join finishes and rewards, build the group's Arrow batch and
publish it in a Kafka transaction with the input offsets (consume -> build -> transactional batch publish).

- a fresh local Kafka broker (``deploy/kafka``), topics as ``floe topics create`` makes them (8 partitions);
- the real rollout service as a process (``python -m rollout``, scheduling off: the load generator plays the
  scheduler, the gateway nodes and the scorer), ``prefix_merging`` unless ``--builder``;
- synthetic token-level sessions (``services/rollout/tests/simulate.py``: ChatML-like renders, tool-calling turns,
  a system prompt of ``--system-len`` tokens), generated before the clock starts so generation costs nothing;
  each group is G ``SessionRequested``, every session's ``ModelCallRecorded`` events, its ``SessionFinished`` and
  its ``RewardPublished`` (rewards alternate, so every group has signal and none is dropped);
- per offered rate (model calls per second; ``0``: as fast as the generator can publish), fresh topics and a fresh
  rollout process; the clock runs from the first event published to the last group seen in a committed batch.

Printed per rate: offered and folded calls/s, the rollout process's CPU milliseconds per call (``/proc/<pid>/stat``,
the number that sizes a dedicated core), and the latency from a group's last event to the committed batch holding it
(p50 / p95). On this 2-core machine the generator and the broker share the cores with the rollout: the flat-out
figure is a floor for one instance on its own core, and CPU per call is the figure to scale from.

Then the same load flat out over 1, 2 and 3 instances on one consumer group (``--instances``): folded calls/s, and
the balance: input partitions each instance owns and groups each one assembled, as the busiest over the mean (1.0:
even). On a machine whose cores are already busy, more instances cannot fold more in total; the balance is the
figure that carries over. Figures are also written to ``.floe/bench/rollout_load.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
# A test fixture, not service code: synthetic token-level sessions (see its docstring).
sys.path.insert(0, str(ROOT / "services" / "rollout" / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from report import write as write_report  # noqa: E402
from simulate import random_ops, simulate_session  # noqa: E402

from contracts import (  # noqa: E402
    Event,
    ModelCallRecorded,
    Outcome,
    RewardPublished,
    SessionFinished,
    SessionRequested,
    SessionState,
    TokenizationMode,
    TrajectoryBatch,
)
from eventbus import Consumer, KafkaSettings, Producer, ensure_topics  # noqa: E402
from eventbus.broker import LocalBroker, free_port, free_ports  # noqa: E402
from eventbus.logging import configure_logging  # noqa: E402
from floe.stack import ServiceSpec, Stack, python_module  # noqa: E402
from rollout.batching import load_batch_table  # noqa: E402
from rollout.service import Topics  # noqa: E402

EOT = 2  # the simulator's end-of-turn token
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def make_load(args: argparse.Namespace) -> tuple[list[tuple[str, Event]], dict[str, int]]:
    """Every event of every group, in publishing order, and the model calls in each group."""
    rng = random.Random(args.seed)
    events: list[tuple[str, Event]] = []
    calls_per_group: dict[str, int] = {}
    for g in range(args.groups):
        group_id = f"load-{g}"
        sessions = [f"{group_id}-{i}" for i in range(args.group_size)]
        for sid in sessions:
            events.append(
                (
                    "requested",
                    SessionRequested(
                        session_id=sid,
                        group_id=group_id,
                        task_id=f"task-{g % 16}",
                        task_source="toy",
                        harness="toy",
                        metadata={"group_size": str(args.group_size), "group_index": str(g)},
                    ),
                )
            )
        n_calls = 0
        for i, sid in enumerate(sessions):
            ops = random_ops(rng, rng.randint(*args.turns), out_len=(20, 200), tool_len=(20, 600))
            calls = simulate_session(
                sid,
                ops,
                TokenizationMode.EXACT,
                rng,
                system_len=args.system_len,
                task_len=rng.randint(100, 400),
                group_id=group_id,
            )
            events.extend(("calls", c) for c in calls)
            n_calls += len(calls)
            task_id = f"task-{g % 16}"
            events.append(
                (
                    "finished",
                    SessionFinished(
                        session_id=sid,
                        group_id=group_id,
                        task_id=task_id,
                        task_source="toy",
                        harness="toy",
                        node_id="load",
                        status=SessionState.DONE,
                        calls=len(calls),
                    ),
                )
            )
            solved = i % 2 == 0
            events.append(
                (
                    "rewards",
                    RewardPublished(
                        session_id=sid,
                        group_id=group_id,
                        task_id=task_id,
                        reward=float(solved),
                        outcome=Outcome.RESOLVED if solved else Outcome.UNRESOLVED,
                        resolved=solved,
                    ),
                )
            )
        calls_per_group[group_id] = n_calls
    return events, calls_per_group


async def publish(
    producer: Producer, topics: Topics, events: list[tuple[str, Event]], rate: float, last_sent: dict[str, float]
) -> float:
    """Publish in order at ``rate`` model calls per second (0: flat out); return when the first event went."""
    pending: set[asyncio.Task[object]] = set()
    t0 = time.monotonic()
    calls = 0
    for name, event in events:
        if rate and name == "calls":
            calls += 1
            ahead = t0 + calls / rate - time.monotonic()
            if ahead > 0:
                await asyncio.sleep(ahead)
        # Creating the task runs produce() in order (per-key order holds); the acks are awaited in bulk.
        task = asyncio.ensure_future(producer.send(getattr(topics, name), event))
        pending.add(task)
        task.add_done_callback(pending.discard)
        if isinstance(event, RewardPublished):
            last_sent[event.group_id] = time.monotonic()
        if len(pending) >= 2000:
            await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        else:
            await asyncio.sleep(0)
    await asyncio.gather(*pending)
    return t0


async def _states(ports: dict[str, int]) -> dict[str, dict[str, Any]]:
    async with httpx.AsyncClient(timeout=10) as client:
        return {name: (await client.get(f"http://127.0.0.1:{port}/state")).json() for name, port in ports.items()}


async def _settled(ports: dict[str, int], partitions: int, timeout_s: float = 60.0) -> None:
    """Wait until the instances own every input partition between them and exactly one leads."""
    deadline = time.monotonic() + timeout_s
    while True:
        states = await _states(ports)
        owned = sum(len(st["shard"]["partitions"]) for st in states.values())
        leaders = sum(bool(st["leader"]) for st in states.values())
        if owned == partitions and leaders == 1:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"instances own {owned} of {partitions} partitions, {leaders} leader(s)")
        await asyncio.sleep(0.5)


async def run_rate(
    rate: float,
    instances: int,
    args: argparse.Namespace,
    kafka: KafkaSettings,
    work: Path,
    events: list[tuple[str, Event]],
    calls_per_group: dict[str, int],
) -> dict[str, float]:
    suffix = f".load{int(rate)}x{instances}"
    topics = Topics.with_suffix(suffix)
    await ensure_topics(kafka, topics.all)
    run_dir = work / f"rate{int(rate)}x{instances}"
    ports = {("rollout" if i == 0 else f"rollout-{i + 1}"): free_port() for i in range(instances)}
    specs = [
        ServiceSpec(
            name,
            python_module("rollout"),
            {
                "FLOE_KAFKA_BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
                "FLOE_ROLLOUT_SCHEDULE": "false",
                "FLOE_ROLLOUT_TOPIC_SUFFIX": suffix,
                "FLOE_ROLLOUT_GROUP_ID": f"rollout{suffix}",
                "FLOE_ROLLOUT_INSTANCE_ID": f"{name}{suffix}",
                "FLOE_ROLLOUT_BUILDER": args.builder,
                "FLOE_ROLLOUT_GROUPS_PER_BATCH": str(args.groups_per_batch),
                "FLOE_ROLLOUT_GROUP_SELECTION": "off",
                "FLOE_ROLLOUT_EOT_TOKEN_IDS": json.dumps([EOT]),
                "FLOE_ROLLOUT_CLAIM_URL": str(run_dir / "batches"),
                "FLOE_ROLLOUT_DATASET_DIR": "",
                "FLOE_ROLLOUT_HTTP_PORT": str(port),
                "FLOE_ROLLOUT_LOG_LEVEL": "WARNING",
            },
            ready_url=f"http://127.0.0.1:{port}/health",
        )
        for name, port in ports.items()
    ]
    stack = Stack(run_dir)
    last_sent: dict[str, float] = {}
    latencies: list[float] = []
    seen: set[str] = set()
    try:
        for spec in specs:
            await asyncio.to_thread(stack.start, spec)
        # The group-keyed inputs the shards share (the leader's topic has one partition, owned by one of them).
        await _settled(
            ports, sum(t.partitions for t in (topics.requested, topics.finished, topics.calls, topics.rewards))
        )
        pids = [stack.pid(name) for name in ports]
        async with (
            Producer(kafka) as producer,
            Consumer(kafka, [topics.batches], group_id=f"bench{suffix}") as batches,
        ):
            await batches.next(timeout_s=1.0)  # join the group before the load starts
            cpu0 = sum(cpu_s(pid) for pid in pids)
            sender = asyncio.create_task(publish(producer, topics, events, rate, last_sent))
            deadline = time.monotonic() + args.timeout_s
            while len(seen) < len(calls_per_group):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"rate {rate}: {len(seen)} of {len(calls_per_group)} groups batched")
                msg = await batches.next(timeout_s=0.5)
                if msg is None or not isinstance(msg.event, TrajectoryBatch):
                    continue
                now = time.monotonic()
                table = await asyncio.to_thread(load_batch_table, msg.event)
                for group_id in set(table.column("group_id").to_pylist()):
                    if group_id in seen:
                        raise AssertionError(f"group {group_id} batched twice")
                    seen.add(group_id)
                    latencies.append(now - last_sent[group_id])
            end = time.monotonic()
            cpu = sum(cpu_s(pid) for pid in pids) - cpu0
            t0 = await sender
        states = await _states(ports)
    finally:
        await asyncio.to_thread(stack.stop_all)
    calls = sum(calls_per_group.values())
    wall = end - t0
    latencies.sort()
    assembled = [int(st["shard"]["groups_assembled"]) for st in states.values()]
    owned = [len(st["shard"]["partitions"]) for st in states.values()]
    return {
        "offered_calls_per_s": rate,
        "instances": instances,
        "calls_per_s": calls / wall,
        "cpu_ms_per_call": cpu / calls * 1000,
        "calls_per_cpu_s": calls / cpu if cpu else float("nan"),
        "group_latency_p50_s": statistics.median(latencies),
        "group_latency_p95_s": latencies[min(len(latencies) - 1, int(0.95 * len(latencies)))],
        "wall_s": wall,
        # Balance: the busiest instance's share over an even share (1.0 = perfectly even).
        "partitions_max_over_mean": max(owned) / (sum(owned) / len(owned)),
        "groups_max_over_mean": max(assembled) / (sum(assembled) / len(assembled)),
        "groups_per_instance": "/".join(str(g) for g in assembled),  # type: ignore[dict-item]
        "partitions_per_instance": "/".join(str(p) for p in owned),  # type: ignore[dict-item]
    }


async def main_async(args: argparse.Namespace) -> int:
    t = time.monotonic()
    events, calls_per_group = make_load(args)
    calls = sum(calls_per_group.values())
    tokens = sum(len(e.completion_token_ids) for _, e in events if isinstance(e, ModelCallRecorded))
    print(
        f"load: {args.groups} groups x {args.group_size} sessions, {calls} model calls "
        f"({calls / args.groups / args.group_size:.1f} per session, {tokens} sampled tokens), {len(events)} events; "
        f"generated in {time.monotonic() - t:.1f} s",
        flush=True,
    )
    results: dict[float, dict[str, float]] = {}
    scaled: dict[int, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="floe-bench-rollout-load-") as tmp:
        work = args.keep or Path(tmp)
        broker = LocalBroker.at(work / "kafka")
        address = await asyncio.to_thread(broker.start, *free_ports(2), owner_pid=os.getpid())
        kafka = KafkaSettings(bootstrap_servers=address)
        try:
            for rate in args.rates:
                print(f"== one instance, offered {'flat out' if not rate else f'{rate:g} calls/s'}", flush=True)
                results[rate] = await run_rate(rate, 1, args, kafka, work, events, calls_per_group)
                print("   " + _line(results[rate]), flush=True)
            for n in args.instances:
                if n == 1 and 0.0 in results:
                    scaled[n] = results[0.0]
                    continue
                print(f"== {n} instances, flat out", flush=True)
                scaled[n] = await run_rate(0.0, n, args, kafka, work, events, calls_per_group)
                print("   " + _line(scaled[n]), flush=True)
        finally:
            await asyncio.to_thread(broker.stop)
    print(
        f"\none rollout instance ({args.builder}, {args.groups_per_batch} groups per batch), "
        f"{os.cpu_count()} cores shared with the broker and the generator"
    )
    header = "".join(f"{'flat out' if not r else f'{r:g}/s':>12}" for r in results)
    print(f"{'offered calls/s':<30}{header}")
    for key, label, fmt in (
        ("calls_per_s", "folded calls/s", "{:>12.0f}"),
        ("cpu_ms_per_call", "rollout CPU ms per call", "{:>12.2f}"),
        ("calls_per_cpu_s", "calls per rollout CPU-second", "{:>12.0f}"),
        ("group_latency_p50_s", "group -> batch p50 (s)", "{:>12.2f}"),
        ("group_latency_p95_s", "group -> batch p95 (s)", "{:>12.2f}"),
        ("wall_s", "wall (s)", "{:>12.1f}"),
    ):
        print(f"{label:<30}" + "".join(fmt.format(r[key]) for r in results.values()))
    rates = list(results)
    if len(rates) > 1 and rates[0] == 0:
        for r in rates[1:]:
            if r:
                print(f"folded / offered at {r:g}/s: {results[r]['calls_per_s'] / r:.2f}")
    if scaled:
        print("\nseveral instances on one consumer group, flat out (same cores: the total cannot grow here)")
        print(f"{'instances':<30}" + "".join(f"{n:>12}" for n in scaled))
        for key, label, fmt in (
            ("calls_per_s", "folded calls/s", "{:>12.0f}"),
            ("calls_per_cpu_s", "calls per CPU-second (all)", "{:>12.0f}"),
            ("partitions_per_instance", "input partitions each", "{:>12}"),
            ("partitions_max_over_mean", "partitions max / mean", "{:>12.2f}"),
            ("groups_per_instance", "groups assembled each", "{:>12}"),
            ("groups_max_over_mean", "groups max / mean", "{:>12.2f}"),
        ):
            print(f"{label:<30}" + "".join(fmt.format(r[key]) for r in scaled.values()))
        base = scaled[min(scaled)]["calls_per_s"]
        print(
            f"{'folded calls/s ÷ 1 instance':<30}"
            + "".join(f"{r['calls_per_s'] / base:>12.2f}" for r in scaled.values())
        )
    figures: dict[str, float | int | str] = {
        "builder": args.builder,
        "groups": args.groups,
        "group_size": args.group_size,
        "calls": calls,
    }
    for rate, result in results.items():
        tag = "max" if not rate else f"at{int(rate)}"
        figures.update({f"{k}_{tag}": v for k, v in result.items() if k not in ("offered_calls_per_s", "instances")})
    for n, result in scaled.items():
        for key in ("calls_per_s", "calls_per_cpu_s", "partitions_max_over_mean", "groups_max_over_mean"):
            figures[f"{key}_{n}_instances"] = result[key]
        figures[f"groups_per_instance_{n}_instances"] = result["groups_per_instance"]
    write_report("rollout_load", figures)
    return 0


def _line(result: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in result.items())


def _ints(value: str) -> list[int]:
    return [int(v) for v in value.split(",") if v]


def _floats(value: str) -> list[float]:
    return [float(v) for v in value.split(",") if v]


def _pair(value: str) -> tuple[int, int]:
    lo, hi = (int(v) for v in value.split(","))
    return lo, hi


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=48)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--groups-per-batch", type=int, default=4)
    parser.add_argument("--turns", type=_pair, default=(4, 12), help="model calls per session: lo,hi")
    parser.add_argument("--system-len", type=int, default=1500, help="system prompt tokens")
    parser.add_argument("--rates", type=_floats, default=[0.0, 100.0], help="offered calls/s; 0: flat out")
    parser.add_argument("--instances", type=_ints, default=[1, 2, 3], help="rollout instances to compare, flat out")
    parser.add_argument("--builder", default="prefix_merging", choices=["prefix_merging", "per_request"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", type=Path, default=None, help="keep the run directory (logs, broker) here")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="per rate")
    configure_logging("bench", level="WARNING")
    return asyncio.run(main_async(parser.parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
