"""Learner busy fraction: synchronous collection vs floe's asynchronous admission with straggler cut-off.

    .venv/bin/python bench/learner_busy/run.py [--steps 24] [--sync-steps 8] [--median-s 2] [--tail-fraction 0.1]

Polar's headline is GPU utilisation 20.4 % -> 87.7 %: the learner stops waiting on the long tail of sessions. This
bench measures floe's learner the same way, with the real services and a synthetic fleet:

- a fresh local Kafka broker; the real rollout service (``python -m rollout``, scheduling on) and the real learner
  (``python -m learner``, a random Qwen2-style model of ``--hidden`` width on CPU, one torch thread) as processes;
- a *fleet* in this process, standing in for gateway nodes and scorers: it takes every ``SessionRequested``, waits
  the session's duration, then publishes its model calls (synthetic token-level sessions, stamped with the weight
  version the session was requested at), ``SessionFinished`` and a reward (1 or 0 at random, so groups have signal).
  A ``SessionCancelRequested`` ends the session at once as ``CANCELLED`` (masked in training);
- session durations are heavy-tailed: ``1 - tail_fraction`` of them lognormal with median ``median_s`` (sigma 0.5),
  the rest ``tail_factor`` times longer (a few sessions 20x the median, the shape the issue asks for).

Two modes, same fleet, same seed:

- ``sync``: collect every session of a step, train, repeat (``max_off_policy_steps=0``, no cut-off): the learner
  waits for the slowest session of each step;
- ``async``: asynchronous admission up to ``max_off_policy_steps=4`` steps ahead of the learner, 5 steps' worth
  of groups in flight, and a group's stragglers cancelled once ``min_usable_fraction=0.75`` of it is done. Why 4: a
  group with two tail sessions is not cut (3 of 4 must be done) and stays admitted-but-unfinished for a tail's
  duration, and the lag bound counts it; with lag 2 those groups used up most of the budget and the learner was 61 %
  busy over 24 steps (57 % with more groups in flight, so the lag bound, not the in-flight cap, was the limit).

Sync steps are long (each waits for its slowest session), so the sync run is shorter (``--sync-steps``); the busy
fraction is a per-step ratio either way.

Admission is not capped at ``--steps`` (the rollout keeps scheduling until the bench stops it), so the figures are
the steady state of a long run, not the drain at the end of a finite one (where no new group can replace a
straggling one and the last step waits in both modes).

The learner reports its own clock in every ``WeightsPublished`` (``learner.train.BusyClock``): busy fraction = time
on batches (decode, train, checkpoint) / time since the first batch arrived. Printed side by side with steps per
minute and the sessions cut; also written to ``.floe/bench/learner_busy.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
# Test fixtures, not service code: synthetic token-level sessions and the tiny model (see their docstrings).
sys.path.insert(0, str(ROOT / "services" / "rollout" / "tests"))
sys.path.insert(0, str(ROOT / "services" / "learner" / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from report import write as write_report  # noqa: E402
from simulate import random_ops, simulate_session  # noqa: E402
from synthetic import save_tiny_model  # noqa: E402

from contracts import (  # noqa: E402
    Outcome,
    RewardPublished,
    SessionCancelRequested,
    SessionFinished,
    SessionRequested,
    SessionState,
    TokenizationMode,
    WeightsPublished,
)
from eventbus import Consumer, KafkaSettings, Producer, ensure_topics  # noqa: E402
from eventbus.broker import LocalBroker, free_port, free_ports  # noqa: E402
from eventbus.logging import configure_logging  # noqa: E402
from floe.stack import ServiceSpec, Stack, python_module  # noqa: E402
from rollout.service import Topics  # noqa: E402

EOT = 2  # the simulator's end-of-turn token


@dataclass(frozen=True)
class Mode:
    name: str
    max_off_policy_steps: int
    min_usable_fraction: float
    groups_in_flight: int  # multiples of groups_per_step


MODES = (Mode("sync", 0, 1.0, 1), Mode("async", 4, 0.75, 5))


@dataclass
class Fleet:
    """Gateway nodes and scorers, simulated: every requested session runs for its drawn duration, then reports."""

    kafka: KafkaSettings
    topics: Topics
    rng: random.Random  # token content
    # Durations from their own stream: the n-th request gets the same duration in both modes (the token content
    # draws from ``rng`` interleave with arrivals, which differ between modes).
    durations: random.Random
    median_s: float
    tail_fraction: float
    tail_factor: float
    turns: tuple[int, int] = (2, 4)
    cancels: dict[str, asyncio.Event] = field(default_factory=dict)
    started: int = 0
    cancelled: int = 0
    tail_sessions: int = 0

    def duration(self) -> float:
        body = self.median_s * math.exp(self.durations.gauss(0.0, 0.5))
        if self.durations.random() < self.tail_fraction:
            self.tail_sessions += 1
            return body * self.tail_factor
        return body

    async def run(self, stop: asyncio.Event, group: str) -> None:
        tasks: set[asyncio.Task[None]] = set()
        async with (
            Producer(self.kafka) as producer,
            Consumer(self.kafka, [self.topics.requested], group_id=f"{group}-requests") as requests,
            Consumer(self.kafka, [self.topics.cancel], group_id=f"{group}-cancels") as cancels,
        ):

            async def follow_cancels() -> None:
                while not stop.is_set():
                    msg = await cancels.next(timeout_s=0.2)
                    if msg is not None and isinstance(msg.event, SessionCancelRequested):
                        ev = self.cancels.get(msg.event.session_id)
                        if ev is not None:
                            ev.set()

            follower = asyncio.create_task(follow_cancels())
            try:
                while not stop.is_set():
                    msg = await requests.next(timeout_s=0.2)
                    if msg is None or not isinstance(msg.event, SessionRequested):
                        continue
                    req = msg.event
                    if req.session_id in self.cancels:
                        continue  # a re-published request: the session is already running
                    self.cancels[req.session_id] = asyncio.Event()
                    self.started += 1
                    task = asyncio.create_task(self._session(producer, req, self.duration()))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
            finally:
                follower.cancel()
                for task in [*tasks, follower]:
                    task.cancel()
                await asyncio.gather(*tasks, follower, return_exceptions=True)

    async def _session(self, producer: Producer, req: SessionRequested, duration: float) -> None:
        cancelled = self.cancels[req.session_id]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(cancelled.wait(), timeout=duration)
        base: dict[str, Any] = dict(session_id=req.session_id, group_id=req.group_id, task_id=req.task_id)
        if cancelled.is_set():
            self.cancelled += 1
            await producer.send(
                self.topics.finished,
                SessionFinished(**base, harness=req.harness, node_id="fleet", status=SessionState.CANCELLED, calls=0),
            )
            return
        ops = random_ops(self.rng, self.rng.randint(*self.turns), out_len=(20, 60), tool_len=(20, 60))
        calls = simulate_session(req.session_id, ops, TokenizationMode.EXACT, self.rng, system_len=200, task_len=60)
        for call in calls:
            stamped = call.model_copy(update={"weight_version": req.policy_version})
            await producer.send(self.topics.calls, stamped)
        await producer.send(
            self.topics.finished,
            SessionFinished(**base, harness=req.harness, node_id="fleet", status=SessionState.DONE, calls=len(calls)),
        )
        solved = self.rng.random() < 0.5
        await producer.send(
            self.topics.rewards,
            RewardPublished(
                **base,
                reward=float(solved),
                outcome=Outcome.RESOLVED if solved else Outcome.UNRESOLVED,
                resolved=solved,
            ),
        )


def _state(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/state", timeout=5) as resp:
        return json.loads(resp.read())  # type: ignore[no-any-return]


async def run_mode(mode: Mode, args: argparse.Namespace, kafka: KafkaSettings, work: Path) -> dict[str, float]:
    suffix = f".{mode.name}"
    steps = args.sync_steps if mode.name == "sync" else args.steps
    topics = Topics.with_suffix(suffix)
    await ensure_topics(kafka, topics.all)
    model_dir = work / "model"
    if not model_dir.exists():
        save_tiny_model(
            model_dir,
            vocab_size=1024,
            hidden_size=args.hidden,
            intermediate_size=args.hidden * 2,
            num_layers=args.layers,
            num_heads=4,
            num_kv_heads=2,
        )
    run_dir = work / mode.name
    threads = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    common = {"FLOE_KAFKA_BOOTSTRAP_SERVERS": kafka.bootstrap_servers}
    rollout_port = free_port()
    runs = [{"name": "train", "task_source": "toy", "harness": "toy", "group_size": args.group_size}]
    stack = Stack(run_dir)
    specs = [
        ServiceSpec(
            "learner",
            python_module("learner"),
            {
                **common,
                **threads,
                "FLOE_LEARNER_MODEL_DIR": str(model_dir),
                "FLOE_LEARNER_CHECKPOINT_DIR": str(run_dir / "checkpoints"),
                "FLOE_LEARNER_LR": "1e-3",
                "FLOE_LEARNER_KL_COEF": "0",
                "FLOE_LEARNER_MAX_STALENESS": str(mode.max_off_policy_steps + 1),
                "FLOE_LEARNER_DEVICE": "cpu",
                "FLOE_LEARNER_GROUP_ID": f"learner{suffix}",
                "FLOE_LEARNER_TRAJECTORY_BATCHES_TOPIC": topics.batches.name,
                "FLOE_LEARNER_WEIGHTS_TOPIC": topics.weights.name,
            },
        ),
        ServiceSpec(
            "rollout",
            python_module("rollout"),
            {
                **common,
                "FLOE_ROLLOUT_SCHEDULE": "true",
                "FLOE_ROLLOUT_RUNS": json.dumps(runs),
                "FLOE_ROLLOUT_TOPIC_SUFFIX": suffix,
                "FLOE_ROLLOUT_GROUP_ID": f"rollout{suffix}",
                "FLOE_ROLLOUT_INSTANCE_ID": f"rollout{suffix}",
                "FLOE_ROLLOUT_GROUPS_PER_STEP": str(args.groups_per_step),
                "FLOE_ROLLOUT_GROUPS_PER_BATCH": str(args.groups_per_step),
                "FLOE_ROLLOUT_MAX_GROUPS_IN_FLIGHT": str(args.groups_per_step * mode.groups_in_flight),
                "FLOE_ROLLOUT_MAX_OFF_POLICY_STEPS": str(mode.max_off_policy_steps),
                "FLOE_ROLLOUT_MIN_USABLE_FRACTION": str(mode.min_usable_fraction),
                "FLOE_ROLLOUT_GROUP_SELECTION": "off",
                "FLOE_ROLLOUT_EOT_TOKEN_IDS": json.dumps([EOT]),
                "FLOE_ROLLOUT_CLAIM_URL": str(run_dir / "batches"),
                "FLOE_ROLLOUT_DATASET_DIR": str(run_dir / "dataset"),
                "FLOE_ROLLOUT_HTTP_PORT": str(rollout_port),
            },
            ready_url=f"http://127.0.0.1:{rollout_port}/health",
        ),
    ]
    fleet = Fleet(
        kafka,
        topics,
        random.Random(args.seed),
        random.Random(args.seed + 1),
        args.median_s,
        args.tail_fraction,
        args.tail_factor,
    )
    stop = asyncio.Event()
    published: list[WeightsPublished] = []
    t0 = time.monotonic()
    try:
        for spec in specs:
            await asyncio.to_thread(stack.start, spec)
        fleet_task = asyncio.create_task(fleet.run(stop, f"fleet{suffix}"))
        async with Consumer(kafka, [topics.weights], group_id=f"bench{suffix}") as weights:
            deadline = time.monotonic() + args.timeout_s
            while len({w.version for w in published if w.version > 0}) < steps:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{mode.name}: {len(published)} versions after {args.timeout_s:.0f} s")
                msg = await weights.next(timeout_s=0.5)
                if msg is not None and isinstance(msg.event, WeightsPublished) and msg.event.version > 0:
                    published.append(msg.event)
                    m = msg.event.metrics
                    print(
                        f"  {mode.name} v{msg.event.version:>2}: step {m.get('learner_step_s', 0):5.2f} s, "
                        f"waited {m.get('learner_wait_s', 0):5.2f} s, busy {m.get('learner_busy_fraction', 0):.0%}",
                        flush=True,
                    )
        counters = (await asyncio.to_thread(_state, rollout_port))["scheduler"]["counters"]
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(fleet_task, 30)
        await asyncio.to_thread(stack.stop_all)
    last = max(published, key=lambda w: w.version).metrics
    return {
        "busy_fraction": last["learner_busy_fraction"],
        "steps": float(steps),
        "steps_per_minute": steps / last["learner_window_s"] * 60,
        "window_s": last["learner_window_s"],
        "mean_step_s": last["learner_busy_s"] / steps,
        "sessions_started": float(fleet.started),
        "sessions_cancelled": float(fleet.cancelled),
        "straggler_cuts": float(counters.get("cancelled_straggler", 0)),
        "tail_sessions": float(fleet.tail_sessions),
        "wall_s": time.monotonic() - t0,
    }


async def main_async(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="floe-bench-busy-") as tmp:
        work = args.keep or Path(tmp)
        broker = LocalBroker.at(work / "kafka")
        address = await asyncio.to_thread(broker.start, *free_ports(2), owner_pid=os.getpid())
        kafka = KafkaSettings(bootstrap_servers=address)
        results: dict[str, dict[str, float]] = {}
        try:
            for mode in [m for m in MODES if m.name in args.modes]:
                print(
                    f"== {mode.name}: max_off_policy_steps={mode.max_off_policy_steps}, "
                    f"min_usable_fraction={mode.min_usable_fraction}",
                    flush=True,
                )
                results[mode.name] = await run_mode(mode, args, kafka, work)
        finally:
            await asyncio.to_thread(broker.stop)
    if len(results) < 2:
        print(json.dumps(results, indent=1))
        return 0
    s, a = results["sync"], results["async"]
    print(
        f"\nlearner busy bench: {args.sync_steps} sync / {args.steps} async steps x {args.groups_per_step} groups x "
        f"{args.group_size} sessions; "
        f"durations: {1 - args.tail_fraction:.0%} lognormal(median {args.median_s} s, sigma 0.5), "
        f"{args.tail_fraction:.0%} x{args.tail_factor:g}; model hidden {args.hidden}, {args.layers} layers, 1 thread"
    )
    print(f"{'':<26}{'sync':>10}{'async':>10}{'async/sync':>12}")
    for key, label, fmt in (
        ("busy_fraction", "learner busy fraction", "{:>10.1%}"),
        ("steps", "steps measured", "{:>10.0f}"),
        ("steps_per_minute", "steps per minute", "{:>10.2f}"),
        ("mean_step_s", "mean step (s)", "{:>10.2f}"),
        ("window_s", "first batch -> last (s)", "{:>10.1f}"),
        ("sessions_started", "sessions started", "{:>10.0f}"),
        ("sessions_cancelled", "sessions cut (masked)", "{:>10.0f}"),
        ("tail_sessions", "tail sessions drawn", "{:>10.0f}"),
    ):
        ratio = a[key] / s[key] if s[key] else float("nan")
        print(f"{label:<26}{fmt.format(s[key])}{fmt.format(a[key])}{ratio:>12.2f}")
    figures = {f"{k}_{mode}": v for mode, r in results.items() for k, v in r.items()}
    figures["busy_ratio"] = a["busy_fraction"] / s["busy_fraction"]
    figures["steps_per_minute_ratio"] = a["steps_per_minute"] / s["steps_per_minute"]
    figures.update(median_s=args.median_s, tail_fraction=args.tail_fraction, tail_factor=args.tail_factor)
    write_report("learner_busy", figures)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=24, help="learner steps measured (async)")
    parser.add_argument("--sync-steps", type=int, default=8, help="learner steps measured (sync: ~1 min each)")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--groups-per-step", type=int, default=2)
    parser.add_argument("--median-s", type=float, default=2.0, help="median session duration")
    parser.add_argument("--tail-fraction", type=float, default=0.1, help="share of sessions in the long tail")
    parser.add_argument("--tail-factor", type=float, default=20.0, help="how much longer a tail session runs")
    parser.add_argument("--hidden", type=int, default=256, help="width of the random learner model")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--modes", type=lambda v: v.split(","), default=[m.name for m in MODES], help="sync,async")
    parser.add_argument("--keep", type=Path, default=None, help="keep the run directory (services' logs) here")
    parser.add_argument("--timeout-s", type=float, default=900.0, help="per mode")
    configure_logging("bench", level="WARNING")
    return asyncio.run(main_async(parser.parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
