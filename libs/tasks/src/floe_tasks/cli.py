"""``floe tasks list|show|validate``.

``validate`` first checks each instance's structure (snapshot present and checkout-able, gold patch free of test
files, test patch only test files, FAIL_TO_PASS non-empty), then, unless ``--no-grade``, grades gold / empty /
test-patch-only diffs through the scorer (``scorer.validation``, imported lazily so this library depends on no
service; without the scorer installed, ``--no-grade`` is required).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from floe_tasks.errors import TaskError
from floe_tasks.task import Task
from floe_tasks.taskset import TaskSet

__all__ = ["main", "structural_problems"]


def _is_test_path(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return "tests/" in f"/{path}" or name.startswith("test_") or name.endswith("_test.py") or name == "conftest.py"


def structural_problems(task: Task) -> list[str]:
    problems: list[str] = []
    if task.evaluator == "answer":
        if task.answer is None:
            problems.append("answer task without 'answer'")
        return problems
    if task.snapshot is None:
        problems.append("no repository snapshot (bundle) found")
    if not task.FAIL_TO_PASS:
        problems.append("FAIL_TO_PASS is empty")
    if not task.patch.strip() or not task.test_patch.strip():
        problems.append("patch or test_patch is empty")
    if [p for p in _patch_paths(task.patch) if _is_test_path(p)]:
        problems.append("gold patch touches test files")
    if [p for p in _patch_paths(task.test_patch) if not _is_test_path(p)]:
        problems.append("test_patch touches non-test files")
    if task.snapshot is not None:
        with tempfile.TemporaryDirectory() as tmp:
            try:
                task.materialize(Path(tmp) / "w")
            except TaskError as exc:
                problems.append(f"cannot materialize: {exc}")
    return problems


def _patch_paths(diff: str) -> list[str]:
    from floe_tasks.task import patch_files

    return patch_files(diff)


def _load(source: str) -> TaskSet:
    return TaskSet.bundled() if source == "bundled" else TaskSet.from_jsonl(source)


def _cmd_list(ts: TaskSet, args: argparse.Namespace) -> int:
    for task in ts:
        title = task.problem_statement.strip().splitlines()[0] if task.problem_statement.strip() else ""
        print(
            f"{task.instance_id}\t{task.evaluator}\tF2P={len(task.FAIL_TO_PASS)}\tP2P={len(task.PASS_TO_PASS)}\t{title}"
        )
    print(f"# {len(ts)} tasks, digest {ts.digest[:16]}", file=sys.stderr)
    return 0


def _cmd_show(ts: TaskSet, args: argparse.Namespace) -> int:
    task = ts.get(args.instance_id)
    data: dict[str, Any] = task.model_dump(mode="json")
    if not args.with_solution:  # the hidden parts stay hidden unless asked for
        data.pop("patch", None)
        data.pop("test_patch", None)
    print(json.dumps(data, indent=2))
    return 0


def _cmd_validate(ts: TaskSet, args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    failed = 0
    for task in ts:
        for problem in structural_problems(task):
            failed += 1
            print(f"FAIL {task.instance_id}: {problem}")
    if failed:
        return 1
    print(f"structure ok: {len(ts)} tasks ({time.monotonic() - t0:.1f}s)")
    if args.no_grade:
        return 0
    try:
        validation = importlib.import_module("scorer.validation")
        factory = importlib.import_module("scorer.factory")
        settings_mod = importlib.import_module("scorer.settings")
    except ImportError:
        print("grading needs the floe-scorer package (or pass --no-grade)", file=sys.stderr)
        return 2
    settings = settings_mod.ScorerSettings()
    grader, probe = factory.make_grader(settings)
    rows = validation.validate_taskset(
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="floe tasks", description="inspect and validate task sets")
    parser.add_argument("--source", default="bundled", help="'bundled' or a SWE-bench JSONL path")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="one line per task")
    show = sub.add_parser("show", help="one task as JSON (without gold/test patches unless --with-solution)")
    show.add_argument("instance_id")
    show.add_argument("--with-solution", action="store_true")
    val = sub.add_parser("validate", help="gold -> resolved, empty -> unresolved, test patch alone -> unresolved")
    val.add_argument("--no-grade", action="store_true", help="structural checks only")
    val.add_argument("--no-cache", action="store_true", help="regrade even if this digest validated before")
    val.add_argument("--workers", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        ts = _load(args.source)
        handler = {"list": _cmd_list, "show": _cmd_show, "validate": _cmd_validate}[args.cmd]
        return handler(ts, args)
    except TaskError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
