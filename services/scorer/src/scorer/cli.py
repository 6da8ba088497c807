"""``floe score --task ID --diff FILE``: grade one diff locally and print the report.

Also ``--probe`` (report the isolation level that works here). Settings come from ``FLOE_SCORER_*``; ``--backend``
and ``--timeout`` override them. Exit status: 0 resolved, 1 unresolved, 2 error or bad usage.

``floe score images``: build the docker backend's per-instance images here (``scorer.images``).

``floe score validate``: check a task set, each task by its evaluator: its data first, then (unless ``--no-grade``)
the evaluator's gold / empty / test-patch-only diffs graded in the sandbox. Exit status: 0 valid, 1 a task failed,
2 error. ``floe tasks validate`` is the same command (an alias of the ``floe`` CLI).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from contracts import Outcome
from floe_tasks import TaskError
from scorer.errors import ScorerError
from scorer.factory import load_taskset, make_grader
from scorer.images import DEFAULT_BASE, build_images
from scorer.settings import ScorerSettings
from scorer.testenv import build_testenv
from scorer.validation import task_problems, validate_taskset

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # A subcommand in front of the grade options, so that `floe score --task … --diff …` keeps its spelling.
    if argv[:1] == ["validate"]:
        return _validate(argv[1:])
    if argv[:1] == ["images"]:
        return _images(argv[1:])
    parser = argparse.ArgumentParser(
        prog="floe score",
        description="grade one diff against one task",
        epilog="floe score validate --help: validate a task set; floe score images --help: build docker images",
    )
    parser.add_argument("--task", help="instance id")
    parser.add_argument("--diff", help="diff file ('-' for stdin)")
    parser.add_argument(
        "--task-source",
        "--source",
        dest="source",
        default=None,
        help="'bundled' or a SWE-bench JSONL or Parquet file (default: settings)",
    )
    parser.add_argument("--backend", choices=["bwrap", "docker", "bare"], default=None)
    parser.add_argument(
        "--docker-namespace", default=None, help="docker backend: 'swebench' (official images) or 'floe' (built here)"
    )
    parser.add_argument("--timeout", type=float, default=None, help="wall-clock seconds per instance")
    parser.add_argument("--json", action="store_true", help="print the full report as JSON")
    parser.add_argument("--log", action="store_true", help="also print the tail of the eval log")
    parser.add_argument("--probe", action="store_true", help="only report which isolation works here")
    args = parser.parse_args(argv)
    overrides: dict[str, object] = {}
    if args.backend:
        overrides["backend"] = args.backend
    if args.timeout:
        overrides["timeout_s"] = args.timeout
    if args.docker_namespace:
        overrides["docker_namespace"] = args.docker_namespace
    try:
        settings = ScorerSettings(**overrides)  # type: ignore[arg-type]
        if args.probe:
            grader, probe = make_grader(settings)
            print(json.dumps({"level": probe.level, "checks": probe.checks, "detail": probe.detail}, indent=2))
            return 0
        if not args.task or not args.diff:
            parser.error("--task and --diff are required (or --probe)")
        raw = sys.stdin.buffer.read() if args.diff == "-" else Path(args.diff).read_bytes()
        # A diff is bytes: a hunk of a file that is not UTF-8 must reach ``git apply`` unchanged. surrogateescape
        # keeps each undecodable byte as a lone surrogate that ``Grader`` writes back as that byte.
        diff = raw.decode("utf-8", errors="surrogateescape")
        task = load_taskset(args.source or settings.task_source).get(args.task)
        grader, _ = make_grader(settings)
    except (TaskError, ScorerError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result = grader.grade(task, diff)
    if args.json:
        print(json.dumps(result.summary(), indent=2))
    else:
        print(f"{result.instance_id}: {result.outcome.value} (reward {result.reward:g})")
        print(f"  reason:    {result.reason}")
        print(f"  applied:   {result.apply_status}")
        print(f"  isolation: {result.isolation}")
        for kind, lists in (("FAIL_TO_PASS", result.fail_to_pass), ("PASS_TO_PASS", result.pass_to_pass)):
            for test in lists.get("failure", []):
                status = result.tests.get(test, "MISSING")
                print(f"  {kind} failing: {test} ({'missing: never collected' if status == 'MISSING' else status})")
        print(f"  time:      {result.timings_ms.get('total', 0):.0f} ms")
    if args.log:
        print(result.log_tail)
    return {Outcome.RESOLVED: 0, Outcome.UNRESOLVED: 1}.get(result.outcome, 2)


def _validate(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="floe score validate", description="check every task by its evaluator, then grade its checks"
    )
    parser.add_argument(
        "--task-source",
        "--source",
        dest="source",
        default=None,
        help="'bundled', 'toy' or a SWE-bench JSONL or Parquet file (default: settings)",
    )
    parser.add_argument("--no-grade", action="store_true", help="data checks only")
    parser.add_argument("--no-cache", action="store_true", help="regrade even if this digest validated before")
    parser.add_argument("--workers", type=int, default=0)
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    try:
        # The data checks read the scorer's settings only for the default source: they run no sandbox.
        settings = None if args.no_grade else ScorerSettings()
        ts = load_taskset(args.source or (settings or ScorerSettings()).task_source)
        failed = 0
        for task in ts:
            for problem in task_problems(task):
                failed += 1
                print(f"FAIL {task.instance_id}: {problem}")
        if failed:
            return 1
        print(f"structure ok: {len(ts)} tasks ({time.monotonic() - t0:.1f}s)")
        if settings is None:  # --no-grade
            return 0
        grader, probe = make_grader(settings)
    except (TaskError, ScorerError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rows = validate_taskset(
        ts, grader, workers=args.workers or settings.workers, cache_dir=None if args.no_cache else settings.work_dir
    )
    bad = [r for r in rows if not r.ok]
    for row in rows:
        status = "ok  " if row.ok else "FAIL"
        print(
            f"{status} {row.instance_id} {row.verdicts} {row.seconds:.1f}s"
            + (f" {row.problems}" if row.problems else "")
        )
    print(f"graded {len(rows)} tasks in {time.monotonic() - t0:.1f}s (isolation {probe.level}): {len(bad)} failing")
    return 1 if bad else 0


def _images(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="floe score images",
        description="build the docker backend's images (SWE-bench's layout: an environment image, then one image"
        " per instance with the repository at base_commit in /testbed), skipping those already up to date",
    )
    parser.add_argument("--task-source", "--source", dest="source", default=None, help="'bundled' or a SWE-bench file")
    parser.add_argument("--instance", action="append", default=[], help="only this instance (repeatable)")
    parser.add_argument("--namespace", default="floe", help="image namespace (grade with --docker-namespace NS)")
    parser.add_argument("--base", default=DEFAULT_BASE, help="base image with Python (deploy/docker/base-image.sh)")
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    try:
        settings = ScorerSettings()
        ts = load_taskset(args.source or settings.task_source)
        tasks = [ts.get(i) for i in args.instance] if args.instance else [t for t in ts if t.base_commit]
        settings.work_dir.mkdir(parents=True, exist_ok=True)
        testenv = build_testenv(settings.work_dir, settings.test_python)
        built = build_images(tasks, testenv, namespace=args.namespace, base=args.base)
    except (TaskError, ScorerError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for iid, image in built.items():
        print(f"{iid}: {image}")
    print(
        f"{len(built)} images ready in {time.monotonic() - t0:.1f}s; grade with"
        f" --backend docker --docker-namespace {args.namespace}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
