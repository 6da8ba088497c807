"""Scorer benchmark: grading time per instance in the bwrap sandbox vs bare, and throughput with 1 and 2 workers.

Usage: ``.venv/bin/python bench/scorer/run.py [--instances N] [--repeat R]``

Grades the gold patch of the first N bundled instances (R times each) with each backend, the two backends taking
turns instance by instance (so a change in the machine's load hits both alike), and prints median/p90 per-instance
time side by side with the ratio; then the cost of the sandbox alone (a one-line script, start to teardown); then
grades all N with 1 and 2 concurrent workers under bwrap and prints instances/minute. Writes the figures to
``.floe/bench/scorer.json``. Needs root (or an unprivileged user namespace) and bubblewrap.

The bwrap testbed is a tmpfs (RAM) and the bare one a directory under ``$TMPDIR``: on a machine whose ``/tmp`` is a
disk, the sandbox's test runs can be faster than bare ones, which is why the one-line row is printed too.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from report import write as write_report

from contracts import Outcome
from floe_tasks import Task, TaskSet
from scorer.factory import make_grader
from scorer.grader import Grader
from scorer.sandbox import BareSandbox, BwrapSandbox, Job, Limits, Sandbox
from scorer.settings import ScorerSettings


def _per_instance(graders: list[Grader], tasks: list[Task], repeat: int) -> list[list[float]]:
    """Per-instance times of each grader, taking turns on every instance."""
    times: list[list[float]] = [[] for _ in graders]
    for _ in range(repeat):
        for task in tasks:
            for grader, out in zip(graders, times, strict=True):
                t0 = time.perf_counter()
                res = grader.grade(task, task.patch)
                out.append(time.perf_counter() - t0)
                assert res.outcome is Outcome.RESOLVED, (task.instance_id, res.reason)
    return times


def _launch(sandboxes: list[Sandbox], work: Path, n: int = 30) -> list[float]:
    """Median seconds to run a one-line script in each sandbox, start to teardown: the sandbox's own cost."""
    inp = work / "launch"
    inp.mkdir()
    inp.chmod(0o755)
    (inp / "eval.sh").write_text("echo ok\n")
    (inp / "eval.sh").chmod(0o644)
    times: list[list[float]] = [[] for _ in sandboxes]
    for _ in range(n):
        for sb, out in zip(sandboxes, times, strict=True):
            t0 = time.perf_counter()
            res = sb.run(Job(input_dir=inp, limits=Limits(), name="launch"))
            out.append(time.perf_counter() - t0)
            assert res.output.strip().endswith("ok"), res.output
    return [statistics.median(t) for t in times]


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
        _per_instance([sandboxed, bare], tasks[:2], 1)  # warm the pristine-tree cache and the page cache
        sb, br = _per_instance([sandboxed, bare], tasks, args.repeat)
        launch_sb, launch_br = _launch([BwrapSandbox(), BareSandbox()], Path(tmp))
        print(f"scorer bench: {len(tasks)} instances x {args.repeat}, gold patches, isolation {probe.level}")
        print(f"{'per-instance grading':<30}{'bwrap':>10}{'bare':>10}{'ratio':>8}")
        figures: dict[str, float | str] = {"isolation": probe.level, "instances": len(tasks), "repeat": args.repeat}
        for name, key, fn in (
            ("median (s)", "median", statistics.median),
            ("p90 (s)", "p90", _p90),
            ("mean (s)", "mean", statistics.mean),
        ):
            a, b = fn(sb), fn(br)
            print(f"{name:<30}{a:>10.3f}{b:>10.3f}{a / b:>8.2f}")
            figures.update({f"{key}_s_bwrap": a, f"{key}_s_bare": b, f"sandbox_ratio_{key}": a / b})
        row = f"{launch_sb * 1000:>10.1f}{launch_br * 1000:>10.1f}{launch_sb / launch_br:>8.2f}"
        print(f"{'one-line script (ms)':<30}{row}")
        figures.update(launch_ms_bwrap=launch_sb * 1000, launch_ms_bare=launch_br * 1000)
        t1 = _throughput(sandboxed, tasks, 1)
        t2 = _throughput(sandboxed, tasks, 2)
        print(f"{'throughput (bwrap)':<30}{'1 worker':>10}{'2 workers':>10}{'ratio':>8}")
        print(f"{'instances/minute':<30}{t1:>10.1f}{t2:>10.1f}{t2 / t1:>8.2f}")
        figures.update(instances_per_minute_1_worker=t1, instances_per_minute_2_workers=t2)
    write_report("scorer", figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
