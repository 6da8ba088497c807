"""Session start latency: READY pool vs cold preparation, at 1 and 8 concurrent sessions, side by side.

Start latency = a request accepted by the node -> its harness process running (the RUNNING transition), the
``start_latency_ms`` of ``SessionFinished.timings_ms``. Everything is real: the bundled task is materialized from its
git bundle, prepare steps run in the sandbox, the harness (the ``command`` preset running ``true``) starts in
bubblewrap as the agent uid with its gateway bridge. Only the model is absent (the harness makes no call).

- cold: no READY pool; each session materializes and prepares its own workspace after it is accepted.
- pool: the node's READY pool holds prepared workspaces for the task ahead of demand (look-ahead = concurrency),
  as it does once a task has had demand; sessions take one and start at once.

    .venv/bin/python bench/sessions/run.py [--task floe__calx-7] [--rounds 3] [--prepare 'python3 -m compileall .']

Needs root, bubblewrap and git. Numbers depend on the machine's load (this one is shared): compare the columns.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import secrets
import shutil
import statistics
import time
from pathlib import Path

import structlog

from contracts import SessionRequested, SessionState
from floe_tasks import TaskSet
from gateway.registry import SessionRegistry
from sessions.gateway_node import RegistryGateway
from sessions.node import SessionNode
from sessions.settings import SessionSettings


class _Sink:
    async def state(self, event: object) -> None:
        return None

    async def finished(self, event: object) -> None:
        return None


def _task_source(task_id: str, prepare: str | None, scratch: Path) -> str:
    """'bundled', or a copy of the bundled task with an extra prepare step (a heavier, realistic preparation)."""
    if not prepare:
        return "bundled"
    bundled = TaskSet.bundled()
    task = bundled.get(task_id)
    (scratch / "repos").mkdir(parents=True, exist_ok=True)
    assert task.snapshot is not None
    shutil.copy(task.snapshot, scratch / "repos" / task.snapshot.name)
    row = task.model_dump(mode="json")
    row["prepare"] = [*task.prepare, prepare]
    (scratch / "tasks.jsonl").write_text(json.dumps(row) + "\n")
    return str(scratch / "tasks.jsonl")


async def _round(mode: str, concurrency: int, source: str, task_id: str, work_root: Path) -> list[float]:
    pool = mode == "pool"
    settings = SessionSettings(
        node_id="bench",
        work_root=work_root,
        max_running=8,
        max_preparing=4,
        pool_lookahead=concurrency if pool else 0,
        pool_max_per_task=concurrency if pool else 0,
        prepare_network=False,
    )
    url = "http://127.0.0.1:9"
    node = SessionNode(settings, kafka=None, gateway=RegistryGateway(SessionRegistry(url), url))  # type: ignore[arg-type]
    node.start_local(_Sink())
    try:
        if pool:
            # The pool as it stands once the task has had demand: spares prepared ahead, nothing being prepared.
            node.pool.warm(f"{source}:{task_id}", node.tasks.resolve(source, task_id))
            await node.pool.wait_idle(300)
        requests = [
            SessionRequested(
                session_id="s-bench-" + secrets.token_hex(6),
                group_id="g-bench",
                task_id=task_id,
                task_source=source,
                harness="command",
                metadata={"command": "true"},
                agent_timeout_s=120,
                session_timeout_s=600,
            )
            for _ in range(concurrency)
        ]
        for r in requests:
            await node.submit(r)
        results = [await node.wait_finished(r.session_id, 600) for r in requests]
    finally:
        await node.shutdown()
    for f in results:
        if f.status is not SessionState.DONE:
            raise SystemExit(f"session {f.session_id} ended {f.status.value}: {f.reason}")
    return [f.timings_ms["start_latency_ms"] for f in results]


def _fmt(values: list[float]) -> str:
    values = sorted(values)
    p50 = statistics.median(values)
    p90 = values[min(len(values) - 1, round(0.9 * (len(values) - 1)))]
    return f"{p50:8.1f} {p90:8.1f}"


async def main() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="floe__calx-7")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prepare", default=None, help="extra prepare step, e.g. 'python3 -m compileall -q .'")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the sandbox drops to the agent uid")
    work_root = Path("/tmp") / f"floe-bench-sessions-{secrets.token_hex(4)}"
    work_root.mkdir(mode=0o711)
    try:
        source = _task_source(args.task, args.prepare, work_root / "taskset")
        rows = []
        for concurrency in args.concurrency:
            samples: dict[str, list[float]] = {"cold": [], "pool": []}
            for _ in range(args.rounds):
                for mode in ("cold", "pool"):  # interleaved so machine load hits both alike
                    samples[mode] += await _round(mode, concurrency, source, args.task, work_root)
            rows.append((concurrency, samples))
        print(
            f"\nsession start latency (accepted -> harness running), ms; task {args.task}, "
            f"prepare={args.prepare or 'bundled steps'}, {args.rounds} rounds"
        )
        print(f"{'sessions':>8} | {'cold p50':>8} {'p90':>8} | {'pool p50':>8} {'p90':>8} | {'p50 ratio':>9}")
        for concurrency, samples in rows:
            ratio = statistics.median(samples["cold"]) / statistics.median(samples["pool"])
            print(f"{concurrency:>8} | {_fmt(samples['cold'])} | {_fmt(samples['pool'])} | {ratio:8.1f}x")
    finally:
        shutil.rmtree(work_root, ignore_errors=True)


if __name__ == "__main__":
    t0 = time.monotonic()
    asyncio.run(main())
    print(f"(bench took {time.monotonic() - t0:.1f}s)")
