"""Scorer benchmark: grading time per instance in the bwrap sandbox vs bare, and throughput with 1 and 2 workers.

Usage: ``.venv/bin/python bench/scorer/run.py [--instances N] [--repeat R]``

Grades the gold patch of the first N bundled instances (R times each) with each backend, sequentially, and prints
median/p90 per-instance time side by side with the ratio; then grades all N with 1 and 2 concurrent workers under
bwrap and prints instances/minute. Needs root (or an unprivileged user namespace) and bubblewrap.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from contracts import Outcome
from floe_tasks import Task, TaskSet
from scorer.factory import make_grader
from scorer.grader import Grader
from scorer.settings import ScorerSettings


def _per_instance(grader: Grader, tasks: list[Task], repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        for task in tasks:
            t0 = time.perf_counter()
            res = grader.grade(task, task.patch)
            times.append(time.perf_counter() - t0)
            assert res.outcome is Outcome.RESOLVED, (task.instance_id, res.reason)
    return times


def _throughput(grader: Grader, tasks: list[Task], workers: int) -> float:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(lambda t: grader.grade(t, t.patch), tasks))
    took = time.perf_counter() - t0
    assert all(r.outcome is Outcome.RESOLVED for r in results)
    return len(tasks) / took * 60


def _p90(xs: list[float]) -> float:
    return sorted(xs)[max(0, int(len(xs) * 0.9) - 1)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args(argv)
    tasks = list(TaskSet.bundled())[: args.instances]
    with tempfile.TemporaryDirectory(prefix="floe-bench-", dir="/var/tmp") as tmp:
        Path(tmp).chmod(0o755)
        base = ScorerSettings(work_dir=Path(tmp), workers=2)
        sandboxed, probe = make_grader(base)
        bare, _ = make_grader(base.model_copy(update={"backend": "bare", "allow_unsandboxed": True}))
        for g in (sandboxed, bare):  # warm the pristine-tree cache and the page cache
            _per_instance(g, tasks[:2], 1)
        sb = _per_instance(sandboxed, tasks, args.repeat)
        br = _per_instance(bare, tasks, args.repeat)
        print(f"scorer bench: {len(tasks)} instances x {args.repeat}, gold patches, isolation {probe.level}")
        print(f"{'per-instance grading':<24}{'bwrap':>10}{'bare':>10}{'ratio':>8}")
        for name, fn in (("median (s)", statistics.median), ("p90 (s)", _p90), ("mean (s)", statistics.mean)):
            a, b = fn(sb), fn(br)
            print(f"{name:<24}{a:>10.3f}{b:>10.3f}{a / b:>8.2f}")
        t1 = _throughput(sandboxed, tasks, 1)
        t2 = _throughput(sandboxed, tasks, 2)
        print(f"{'throughput (bwrap)':<24}{'1 worker':>10}{'2 workers':>10}{'ratio':>8}")
        print(f"{'instances/minute':<24}{t1:>10.1f}{t2:>10.1f}{t2 / t1:>8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
