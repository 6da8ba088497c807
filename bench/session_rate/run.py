"""Sessions per second of the demo's toy workload, stage by stage, for harness presets side by side.

    .venv/bin/python bench/session_rate/run.py [--sessions 64] [--presets toy,toy-stdlib]

Where does a toy session's second go? This runs the demo's own stack for ``--model tiny`` (``floe.demo``: a local
Kafka broker, the CPU engine with the tiny model, a gateway node with the demo's limits, the scorer), without the
rollout and the learner: the bench itself publishes ``SessionRequested`` for the toy tasks in groups of 8 (the
demo's group size, so the READY pool works as in the demo) and waits for every ``RewardPublished``. Everything else
is real: the harness runs sandboxed, calls the engine through the gateway over HTTP, its answer is graded in the
scorer's sandbox.

For each preset (default: ``toy``, the toy agent with the official openai SDK, which is what the demo runs;
``toy-stdlib``, the same agent with a standard-library client) it prints sessions per second
(first request to last reward), the medians of the node's stage timings (``SessionFinished.timings_ms``) and of the
scorer's, end-to-end latency, and CPU seconds per session: the whole machine's (``/proc/stat``: everything, the
sandboxed harnesses included, and whatever else the machine ran meanwhile) and each service process's own (the
harnesses are not in the gateway node's: their sandboxes' processes are not reaped by it). Writes
``.floe/bench/session_rate.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from report import write as write_report

from contracts import (
    REWARDS,
    SESSIONS_FINISHED,
    SESSIONS_REQUESTED,
    RewardPublished,
    SamplingPolicy,
    SessionFinished,
    SessionRequested,
)
from eventbus import Consumer, KafkaSettings, Producer
from eventbus.logging import configure_logging
from floe.demo import Demo, DemoConfig
from floe.stack import Stack
from floe_tasks import TaskSet

SERVICES = ("inference", "gateway", "scorer")
NODE_STAGES = ("acquire_ms", "ready_wait_ms", "start_latency_ms", "agent_ms", "diff_ms", "cleanup_ms", "total_ms")
TICK = os.sysconf("SC_CLK_TCK")


def machine_cpu_s() -> float:
    """CPU seconds the whole machine spent so far (every process: engine, node, harnesses, scorer, broker)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / TICK


def cpu_s(pid: int) -> float:
    """utime + stime of the process and of its waited-for children (the sandboxes it ran), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / TICK


async def run_preset(preset: str, n: int, kafka: KafkaSettings, stack: Stack, tasks: list[str]) -> dict[str, float]:
    tag = uuid.uuid4().hex[:6]
    sampling = SamplingPolicy(temperature=1.0, top_p=1.0, max_tokens=8)
    requests = [
        SessionRequested(
            session_id=f"{preset}-{tag}-{i:04d}",
            group_id=f"{preset}-{tag}-g{i // 8}",
            task_id=tasks[(i // 8) % len(tasks)],
            task_source="toy",
            harness=preset,
            sampling=sampling,
            model="policy",
            agent_timeout_s=120,
            session_timeout_s=300,
        )
        for i in range(n)
    ]
    wanted = {r.session_id for r in requests}
    finished: dict[str, SessionFinished] = {}
    rewards: dict[str, RewardPublished] = {}
    cpu0 = {name: cpu_s(stack.pid(name)) for name in SERVICES}
    machine0 = machine_cpu_s()
    async with (
        # From the start of the topics (a fresh group): nothing published before the subscription is missed; the
        # warm-up's events are filtered out by session id.
        Consumer[SessionFinished | RewardPublished](
            kafka,
            [SESSIONS_FINISHED, REWARDS],  # type: ignore[list-item]  # Topic is invariant; both decode to the union
            group_id=f"bench-{tag}",
        ) as consumer,
        Producer(kafka) as producer,
    ):
        t0 = time.monotonic()
        for req in requests:
            await producer.send(SESSIONS_REQUESTED, req)
        deadline = t0 + 60 + 10 * n
        while len(rewards) < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{preset}: {len(rewards)}/{n} rewards; see {stack.logs}")
            msg = await consumer.next(timeout_s=0.5)
            if msg is None or msg.event.session_id not in wanted:
                continue
            if isinstance(msg.event, SessionFinished):
                finished[msg.event.session_id] = msg.event
            elif isinstance(msg.event, RewardPublished):
                rewards[msg.event.session_id] = msg.event
        took = time.monotonic() - t0
    cpu1 = {name: cpu_s(stack.pid(name)) for name in SERVICES}
    machine = machine_cpu_s() - machine0
    errors = sum(r.outcome.value == "error" for r in rewards.values())
    not_done = sum(f.status.value != "DONE" for f in finished.values())
    out: dict[str, float] = {"sessions_per_s": n / took, "wall_s": took, "errors": errors, "not_done": not_done}
    for stage in NODE_STAGES:
        values = [f.timings_ms[stage] for f in finished.values() if stage in f.timings_ms]
        if values:
            out[stage] = statistics.median(values)
    scorer_keys = sorted({k for r in rewards.values() for k in r.timings_ms})
    for key in scorer_keys:
        out[f"scorer_{key}"] = statistics.median(r.timings_ms[key] for r in rewards.values() if key in r.timings_ms)
    by_id = {r.session_id: r for r in requests}
    out["end_to_end_ms"] = statistics.median(r.scored_at - by_id[s].requested_at for s, r in rewards.items())
    for name in SERVICES:
        out[f"cpu_s_per_session_{name}"] = (cpu1[name] - cpu0[name]) / n
    out["cpu_s_per_session_machine"] = machine / n
    return out


async def measure(args: argparse.Namespace, demo: Demo) -> dict[str, dict[str, float]]:
    assert demo.stack is not None
    tasks = TaskSet.from_source("toy").ids()
    results: dict[str, dict[str, float]] = {}
    for preset in args.presets:
        # A short warm-up per preset: the harness's files in the page cache, the READY pool primed for the tasks.
        await run_preset(preset, 8, demo.kafka, demo.stack, tasks)
        print(f"== {preset}: {args.sessions} sessions", flush=True)
        results[preset] = await run_preset(preset, args.sessions, demo.kafka, demo.stack, tasks)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--presets", type=lambda s: s.split(","), default=["toy", "toy-stdlib"])
    args = parser.parse_args(argv)
    configure_logging("bench", level="WARNING")
    with tempfile.TemporaryDirectory(prefix="floe-bench-rate-") as tmp:
        demo = Demo(DemoConfig.for_model("tiny", run_dir=Path(tmp), dashboard=False))
        try:
            demo.up(only=SERVICES)
            results = asyncio.run(measure(args, demo))
        finally:
            demo.down()
    names = args.presets
    print(f"\nsession rate bench: toy tasks, tiny model, the demo's gateway node limits, {args.sessions} sessions each")
    header = "".join(f"{n:>14}" for n in names)
    ratio = len(names) == 2
    print(f"{'':<34}{header}{'ratio' if ratio else '':>10}")
    rows = [("sessions per second", "sessions_per_s", "{:>14.2f}"), ("wall (s)", "wall_s", "{:>14.1f}")]
    rows += [(f"node {k.removesuffix('_ms')} (ms, median)", k, "{:>14.0f}") for k in NODE_STAGES]
    scorer = sorted({k for r in results.values() for k in r if k.startswith("scorer_")})
    rows += [(f"{k.removesuffix('_ms')} (ms, median)", k, "{:>14.0f}") for k in scorer]
    rows += [("end to end (ms, median)", "end_to_end_ms", "{:>14.0f}")]
    rows += [("CPU s/session: whole machine", "cpu_s_per_session_machine", "{:>14.3f}")]
    rows += [(f"CPU s/session: {s} process", f"cpu_s_per_session_{s}", "{:>14.3f}") for s in SERVICES]
    rows += [("not DONE / error outcomes", "not_done", "{:>14.0f}")]
    for label, key, fmt in rows:
        values = [results[n].get(key, float("nan")) for n in names]
        cells = "".join(fmt.format(v) for v in values)
        r = f"{values[1] / values[0]:>10.2f}" if ratio and values[0] else ""
        print(f"{label:<34}{cells}{r}")
    figures: dict[str, float | str] = {f"{k}_{n.replace('-', '_')}": v for n in names for k, v in results[n].items()}
    if ratio:
        figures["sessions_per_s_ratio"] = results[names[1]]["sessions_per_s"] / results[names[0]]["sessions_per_s"]
    figures["presets"] = ",".join(names)
    write_report("session_rate", figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
