"""``floe tasks list|show``: look at a task set.

Validating one is the scorer's (each task is checked by its evaluator): ``floe score validate``. The ``floe`` CLI
routes the old spelling, ``floe tasks validate``, there; this library imports no service.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from floe_tasks.errors import TaskError
from floe_tasks.taskset import TaskSet

__all__ = ["main"]


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="floe tasks",
        description="inspect task sets",
        epilog="validate one: floe score validate (or floe tasks validate)",
    )
    parser.add_argument(
        "--task-source",
        "--source",
        dest="source",
        default="bundled",
        help="'bundled', 'toy' or a SWE-bench JSONL or Parquet path",
    )
    # The same flag after the subcommand too (`floe tasks list --task-source toy`); SUPPRESS keeps the top-level value
    # unless it is given there.
    after = argparse.ArgumentParser(add_help=False)
    after.add_argument("--task-source", "--source", dest="source", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="one line per task", parents=[after])
    show = sub.add_parser(
        "show", help="one task as JSON (without gold/test patches unless --with-solution)", parents=[after]
    )
    show.add_argument("instance_id")
    show.add_argument("--with-solution", action="store_true")
    args = parser.parse_args(argv)
    try:
        ts = TaskSet.from_source(args.source)
        handler = {"list": _cmd_list, "show": _cmd_show}[args.cmd]
        return handler(ts, args)
    except TaskError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
