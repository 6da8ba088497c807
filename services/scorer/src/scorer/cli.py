"""``floe score --task ID --diff FILE``: grade one diff locally and print the report.

Also ``--probe`` (report the isolation level that works here). Settings come from ``FLOE_SCORER_*``; ``--backend``
and ``--timeout`` override them. Exit status: 0 resolved, 1 unresolved, 2 error or bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from contracts import Outcome
from floe_tasks import TaskError
from scorer.errors import ScorerError
from scorer.factory import load_taskset, make_grader
from scorer.settings import ScorerSettings

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="floe score", description="grade one diff against one task")
    parser.add_argument("--task", help="instance id")
    parser.add_argument("--diff", help="diff file ('-' for stdin)")
    parser.add_argument("--source", default=None, help="'bundled' or a SWE-bench JSONL (default: settings)")
    parser.add_argument("--backend", choices=["bwrap", "docker", "bare"], default=None)
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
    try:
        settings = ScorerSettings(**overrides)  # type: ignore[arg-type]
        if args.probe:
            grader, probe = make_grader(settings)
            print(json.dumps({"level": probe.level, "checks": probe.checks, "detail": probe.detail}, indent=2))
            return 0
        if not args.task or not args.diff:
            parser.error("--task and --diff are required (or --probe)")
        diff = sys.stdin.read() if args.diff == "-" else Path(args.diff).read_text(errors="replace")
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
                print(f"  {kind} failing: {test} ({result.tests.get(test, 'missing')})")
        print(f"  time:      {result.timings_ms.get('total', 0):.0f} ms")
    if args.log:
        print(result.log_tail)
    return {Outcome.RESOLVED: 0, Outcome.UNRESOLVED: 1}.get(result.outcome, 2)


if __name__ == "__main__":
    sys.exit(main())
