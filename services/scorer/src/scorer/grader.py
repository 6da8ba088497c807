"""Grade one diff against one task: prepare the job, run the eval script in a sandbox, apply SWE-bench's rules.

Outcomes (``contracts.Outcome``):

- ``resolved`` (reward 1): every FAIL_TO_PASS and PASS_TO_PASS test passes.
- ``unresolved`` (reward 0): anything the diff is responsible for: empty, too large, does not apply, tests fail,
  no parseable results (e.g. ``os._exit`` at import), forged results, CPU or wall-clock limit hit.
- ``error`` (reward 0, masked by training): the fault is ours: the task or its snapshot is missing, the sandbox did
  not start, an unexpected exception.

A timeout is ``unresolved``, not ``error`` (unlike SWE-bench's harness, which writes no report): under RL a diff
that hangs must not escape its negative reward by being masked. Gold validation guarantees the gold patch finishes
well inside the limit.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from contracts import Outcome
from floe_tasks import Task, TaskError, score_answer
from scorer.evalscript import APPLIED_PREFIX, SANDBOX_UP, build_eval_script
from scorer.grading import APPLY_FAILED, TESTS_TIMED_OUT, get_eval_report
from scorer.sandbox import DockerSandbox, Job, Limits, Sandbox
from scorer.testenv import TestEnv

__all__ = ["GradeResult", "Grader"]

log = structlog.get_logger()

CONDA_PREAMBLE = "source /opt/miniconda3/bin/activate && conda activate testbed"


@dataclass
class GradeResult:
    instance_id: str
    outcome: Outcome
    reward: float
    resolved: bool
    reason: str
    apply_status: str = ""
    tests: dict[str, str] = field(default_factory=dict)
    fail_to_pass: dict[str, list[str]] = field(default_factory=dict)
    pass_to_pass: dict[str, list[str]] = field(default_factory=dict)
    timings_ms: dict[str, float] = field(default_factory=dict)
    isolation: str = ""
    log_tail: str = ""

    def summary(self) -> dict[str, object]:
        return {
            "instance_id": self.instance_id,
            "outcome": self.outcome.value,
            "reward": self.reward,
            "resolved": self.resolved,
            "reason": self.reason,
            "apply_status": self.apply_status,
            "isolation": self.isolation,
            "FAIL_TO_PASS": self.fail_to_pass,
            "PASS_TO_PASS": self.pass_to_pass,
            "tests": self.tests,
            "timings_ms": self.timings_ms,
        }


class Grader:
    """Grades diffs with one sandbox backend. Thread-safe: the service calls ``grade`` from N worker threads."""

    def __init__(
        self,
        sandbox: Sandbox,
        testenv: TestEnv | None,
        work_dir: Path,
        limits: Limits,
        *,
        max_diff_bytes: int = 2 * 1024 * 1024,
        protect_test_infra: bool = True,
    ) -> None:
        self.sandbox = sandbox
        self.testenv = testenv
        self.work_dir = Path(work_dir)
        self.limits = limits
        self.max_diff_bytes = max_diff_bytes
        self.protect_test_infra = protect_test_infra
        self._lock = threading.Lock()
        self._src_locks: dict[str, threading.Lock] = {}
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.work_dir.chmod(0o755)

    # ------------------------------------------------------------------------------------------ preparation

    def _pristine(self, task: Task) -> Path:
        """A read-only materialized tree per (task, base commit), created once and shared by jobs."""
        key = f"{task.instance_id}-{task.base_commit[:12]}"
        with self._lock:
            lock = self._src_locks.setdefault(key, threading.Lock())
        with lock:
            dest = self.work_dir / "src" / key
            if not (dest / ".git").exists():
                tmp = self.work_dir / "src" / f".{key}.tmp"
                shutil.rmtree(tmp, ignore_errors=True)
                task.materialize(tmp)
                for path in [tmp, *tmp.rglob("*")]:
                    if not path.is_symlink():
                        path.chmod(0o755 if path.is_dir() else 0o644)
                (self.work_dir / "src").chmod(0o755)
                tmp.rename(dest)
            return dest

    def _prepare_input(self, task: Task, diff: str, apply_patch: bool, inp: Path) -> None:
        inp.chmod(0o755)
        (inp / "model.patch").write_text(diff if diff.endswith("\n") or not diff else diff + "\n")
        # Official SWE-bench images keep the repo at /testbed inside the conda env ``testbed``.
        preamble = CONDA_PREAMBLE if self.sandbox.name == "docker" else ""
        script = build_eval_script(
            task, apply_patch=apply_patch, protect_test_infra=self.protect_test_infra, conda_preamble=preamble
        )
        (inp / "eval.sh").write_text(script)
        bindir = inp / "bin"
        bindir.mkdir()
        if self.testenv is not None:
            (bindir / "python").write_text(self.testenv.wrapper())
        for path in [bindir, *inp.iterdir(), *bindir.iterdir()]:
            path.chmod(0o755 if path.is_dir() or path.parent == bindir else 0o644)
        src = inp / "src"
        # the pristine tree is copied into the sandbox's tmpfs by the script; a symlink would not resolve inside
        # bwrap, so we hard-copy only the small tree (cheap: tasks are tiny) when the backend needs a src.
        if task.snapshot is not None and self.sandbox.name != "docker":
            shutil.copytree(self._pristine(task), src, symlinks=True)

    # ---------------------------------------------------------------------------------------------- grading

    def grade(self, task: Task, diff: str, *, run_empty: bool = False) -> GradeResult:
        t0 = time.monotonic()
        try:
            result = self._grade(task, diff, run_empty=run_empty)
        except TaskError as exc:
            result = GradeResult(task.instance_id, Outcome.ERROR, 0.0, False, f"task error: {exc}")
        except Exception as exc:  # a scorer bug must not take the service down; the session is masked
            log.exception("grading crashed", instance_id=task.instance_id)
            result = GradeResult(
                task.instance_id, Outcome.ERROR, 0.0, False, f"scorer error: {type(exc).__name__}: {exc}"
            )
        result.timings_ms["total"] = round((time.monotonic() - t0) * 1000, 1)
        result.isolation = result.isolation or self.sandbox.isolation
        return result

    def _grade(self, task: Task, diff: str, *, run_empty: bool) -> GradeResult:
        iid = task.instance_id
        if task.evaluator == "answer":
            reward, ok, why = score_answer(task, diff)
            outcome = Outcome.RESOLVED if ok else Outcome.UNRESOLVED
            return GradeResult(iid, outcome, reward, ok, why, apply_status="not applicable")
        size = len(diff.encode("utf-8", errors="replace"))
        if size > self.max_diff_bytes:
            return GradeResult(iid, Outcome.UNRESOLVED, 0.0, False, f"diff too large ({size} bytes)", "rejected")
        empty = not diff.strip()
        if empty and not run_empty:
            return GradeResult(iid, Outcome.UNRESOLVED, 0.0, False, "empty patch", "empty")
        if "\x00" in diff:
            return GradeResult(iid, Outcome.UNRESOLVED, 0.0, False, "diff contains NUL bytes", "rejected")

        timings: dict[str, float] = {}
        t = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="job-", dir=self.work_dir) as tmp:
            inp = Path(tmp)
            self._prepare_input(task, diff, not empty, inp)
            timings["prepare"] = round((time.monotonic() - t) * 1000, 1)
            t = time.monotonic()
            image = task.image or (self.sandbox.image_for(iid) if isinstance(self.sandbox, DockerSandbox) else None)
            res = self.sandbox.run(Job(input_dir=inp, limits=self.limits, image=image, name=iid))
            timings["sandbox"] = round((time.monotonic() - t) * 1000, 1)
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
            out += f"\n{TESTS_TIMED_OUT}\nTimeout error: {self.limits.wall_s} seconds exceeded.\n"
        t = time.monotonic()
        report = get_eval_report(out, task.FAIL_TO_PASS, task.PASS_TO_PASS)
        timings["grade"] = round((time.monotonic() - t) * 1000, 1)
        if res.timed_out:
            reason = f"tests timed out after {self.limits.wall_s:g}s"
        elif APPLY_FAILED in out:
            reason = "patch did not apply"
        elif not report.found and res.returncode is not None and res.returncode < 0:
            reason = f"killed by signal {-res.returncode} ({report.reason})"
        else:
            reason = report.reason
        return GradeResult(
            iid,
            Outcome.RESOLVED if report.resolved else Outcome.UNRESOLVED,
            1.0 if report.resolved else 0.0,
            report.resolved,
            reason,
            apply_status=apply_status,
            tests=report.tests,
            fail_to_pass={"success": report.f2p_success, "failure": report.f2p_failure},
            pass_to_pass={"success": report.p2p_success, "failure": report.p2p_failure},
            timings_ms=timings,
            isolation=res.isolation,
            log_tail=tail,
        )
