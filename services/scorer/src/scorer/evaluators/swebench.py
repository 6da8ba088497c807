"""The ``swebench`` evaluator: SWE-bench 5.0.2's verdict on a diff, from one eval-script run in the sandbox.

Outcomes (``contracts.Outcome``):

- ``resolved`` (reward 1): every FAIL_TO_PASS and PASS_TO_PASS test passes.
- ``unresolved`` (reward 0): anything the diff is responsible for: empty, too large, does not apply, tests fail,
  no parseable results (e.g. ``os._exit`` at import), forged results, a CPU, memory, process-count, file-size or
  wall-clock limit hit (the reason names it: ``SandboxRun.limits_hit``, or the signal in the recorded exit code).
- ``error`` (reward 0, masked by training): the sandbox did not start (the grader adds: task or snapshot missing,
  an unexpected exception).

A timeout is ``unresolved``, not ``error`` (unlike SWE-bench's harness, which writes no report): under RL a diff
that hangs must not escape its negative reward by being masked. Gold validation guarantees the gold patch finishes
well inside the limit.

Validation: a repository snapshot that checks out, FAIL_TO_PASS non-empty, a gold patch free of test files and a
test patch of test files only; then gold -> resolved, empty -> unresolved, test patch alone -> unresolved.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Sequence

from contracts import Outcome
from floe_tasks import Task, patch_files
from sandbox import LimitHit
from scorer.evalscript import APPLIED_PREFIX, SANDBOX_UP
from scorer.evaluators.base import EvalRunner, GradeResult, materialize_problems
from scorer.grading import APPLY_FAILED, TESTS_TIMED_OUT, get_eval_report, recorded_exit_code

__all__ = ["MISSING", "SwebenchEvaluator"]

MISSING = "MISSING"  # a listed test with no result in the log: never collected (``RewardPublished.tests``)


def _is_test_path(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return "tests/" in f"/{path}" or name.startswith("test_") or name.endswith("_test.py") or name == "conftest.py"


class SwebenchEvaluator:
    def grade(self, task: Task, diff: str, runner: EvalRunner, *, run_empty: bool = False) -> GradeResult:
        iid = task.instance_id
        size = len(diff.encode("utf-8", errors="surrogateescape"))
        if size > runner.max_diff_bytes:
            return GradeResult(iid, Outcome.UNRESOLVED, 0.0, False, f"diff too large ({size} bytes)", "rejected")
        empty = not diff.strip()
        if empty and not run_empty:
            return GradeResult(iid, Outcome.UNRESOLVED, 0.0, False, "empty patch", "empty")
        if "\x00" in diff:
            return GradeResult(iid, Outcome.UNRESOLVED, 0.0, False, "diff contains NUL bytes", "rejected")

        res = runner.run_eval(task, diff, apply_patch=not empty)
        timings = dict(res.timings_ms)
        out = res.output
        tail = out[-4000:]
        if SANDBOX_UP not in out:
            return GradeResult(
                iid,
                Outcome.ERROR,
                0.0,
                False,
                f"sandbox did not start (rc={res.returncode}): {out.strip()[-300:]}",
                timings_ms=timings,
                isolation=res.isolation,
                log_tail=tail,
            )
        apply_status = "empty" if empty else "failed"
        for line in out.splitlines():
            if line.startswith(APPLIED_PREFIX):
                apply_status = line[len(APPLIED_PREFIX) :].strip()
        if res.timed_out:
            out += f"\n{TESTS_TIMED_OUT}\nTimeout error: {res.wall_s} seconds exceeded.\n"
        t = time.monotonic()
        report = get_eval_report(out, task.FAIL_TO_PASS, task.PASS_TO_PASS)
        timings["grade"] = round((time.monotonic() - t) * 1000, 1)
        # The sandbox's limits that fired (cgroup memory/pids, rlimits, wall clock), for the reason: a run cut short
        # by one is the diff's failure like any other (reward 0), and the reason says which.
        hits = [hit for hit in res.limits_hit if hit.kind != "wall-clock"]
        if res.timed_out:
            reason = f"tests timed out after {res.wall_s:g}s{_fired(hits)}"
        elif APPLY_FAILED in out:
            reason = "patch did not apply"
        elif not report.found and res.returncode is not None and res.returncode < 0:
            reason = f"killed by signal {-res.returncode} ({report.reason}){_fired(hits)}"
        elif (killed := _killed_by(recorded_exit_code(out), hits)) is not None:
            # The test command died of a signal (bash reports 128+N): say which limit fired, not only "no results".
            text, named = killed
            reason = f"{report.reason}; {text}{_fired([h for h in hits if h is not named])}"
        elif not report.resolved:
            reason = f"{report.reason}{_fired(hits)}"
        else:
            reason = report.reason
        return GradeResult(
            iid,
            Outcome.RESOLVED if report.resolved else Outcome.UNRESOLVED,
            1.0 if report.resolved else 0.0,
            report.resolved,
            reason,
            apply_status=apply_status,
            tests={**report.tests, **dict.fromkeys(report.missing, MISSING)},
            fail_to_pass={"success": report.f2p_success, "failure": report.f2p_failure},
            pass_to_pass={"success": report.p2p_success, "failure": report.p2p_failure},
            timings_ms=timings,
            isolation=res.isolation,
            log_tail=tail,
        )

    def validate(self, task: Task) -> list[str]:
        problems: list[str] = []
        if task.snapshot is None:
            problems.append("no repository snapshot (bundle) found")
        if not task.FAIL_TO_PASS:
            problems.append("FAIL_TO_PASS is empty")
        if not task.patch.strip() or not task.test_patch.strip():
            problems.append("patch or test_patch is empty")
        if [p for p in patch_files(task.patch) if _is_test_path(p)]:
            problems.append("gold patch touches test files")
        if [p for p in patch_files(task.test_patch) if not _is_test_path(p)]:
            problems.append("test_patch touches non-test files")
        problems += _uncollected_tests(task)
        if task.snapshot is not None:
            problems += materialize_problems(task)
        return problems

    def checks(self, task: Task) -> dict[str, str]:
        return {"gold": task.patch, "empty": "", "test_patch_only": task.test_patch}


def _uncollected_tests(task: Task) -> list[str]:
    """Listed tests in files the eval never runs: it runs ``test_cmd`` on the test patch's files only (as SWE-bench
    does), so such a test is never collected and reads as broken, and a gold patch as unresolved. Only pytest ids
    (``path::name``) name their file; other id styles are not checked."""
    run = set(task.test_files)
    problems = []
    for kind, tests in (("FAIL_TO_PASS", task.FAIL_TO_PASS), ("PASS_TO_PASS", task.PASS_TO_PASS)):
        outside = sorted({t.split("::", 1)[0] for t in tests if "::" in t} - run)
        if outside:
            n = sum(1 for t in tests if "::" in t and t.split("::", 1)[0] in outside)
            problems.append(
                f"{n} {kind} test(s) in {', '.join(outside)}, which the eval never runs: it runs only the test "
                f"patch's files ({', '.join(sorted(run)) or 'none'}); those tests are never collected"
            )
    return problems


# What a signal that ends the test command means under the sandbox's rlimits (``sandbox.Limits``).
_LIMIT_SIGNALS = {
    signal.SIGXCPU: "the CPU-time limit (RLIMIT_CPU)",
    signal.SIGXFSZ: "the file-size limit (RLIMIT_FSIZE)",
    signal.SIGKILL: "the CPU-time hard limit or an out-of-memory kill",
}


def _killed_by(code: int | None, hits: Sequence[LimitHit] = ()) -> tuple[str, LimitHit | None] | None:
    """For a test exit code of 128+N, what killed the test run, and the sandbox limit that says so (if one does):
    ``the test run was killed: memory limit (cgroup, 2.0 GiB)`` for a SIGKILL while the cgroup's OOM killer fired,
    ``the test run was killed by SIGXCPU: the CPU-time limit (RLIMIT_CPU)``; None for any other exit code."""
    if code is None or not 128 < code < 128 + 65:
        return None
    try:
        sig = signal.Signals(code - 128)
    except ValueError:
        return f"the test run was killed by signal {code - 128}", None
    memory = next((hit for hit in hits if hit.kind == "memory"), None)
    if sig is signal.SIGKILL and memory is not None:
        return f"the test run was killed: {memory.describe()}", memory
    limit = _LIMIT_SIGNALS.get(sig)
    return f"the test run was killed by {sig.name}{': ' + limit if limit else ''}", None


def _fired(hits: Sequence[LimitHit]) -> str:
    """``; the process-count limit (cgroup, 64) fired``, or "" when no limit did."""
    if not hits:
        return ""
    return "; the " + " and the ".join(hit.describe() for hit in hits) + " fired"
