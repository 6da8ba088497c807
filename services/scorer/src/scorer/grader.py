"""Grade one diff against one task: dispatch to the task's evaluator, and run eval scripts in the sandbox for it.

The ``Grader`` owns everything a grading job shares: the sandbox backend, the test environment, the work
directory, the limits and the pristine trees. What a verdict means belongs to the task's evaluator
(``scorer.evaluators``: ``swebench``, ``answer``); an evaluator that needs code run calls back ``run_eval``.

Faults of ours become ``Outcome.ERROR`` here (reward 0, masked by training), whatever the evaluator: a task that
names an unknown evaluator, a missing task or snapshot (``TaskError``), an unexpected exception.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from pathlib import Path

import structlog

from contracts import Outcome
from floe_tasks import Task, TaskError
from scorer.errors import UnknownEvaluator
from scorer.evalscript import build_eval_script
from scorer.evaluators import GradeResult, SandboxRun, get_evaluator
from scorer.sandbox import DockerSandbox, Job, Limits, Sandbox
from scorer.testenv import TestEnv

__all__ = ["Grader"]

log = structlog.get_logger()

# Official SWE-bench images keep the repo's environment in the conda env ``testbed``; images built by
# ``scorer.images`` have none (their Python is the image's own), so the activation is conditional.
CONDA_PREAMBLE = (
    "if [ -f /opt/miniconda3/bin/activate ]; then source /opt/miniconda3/bin/activate && conda activate testbed; fi"
)


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
        task.require_snapshot()  # before the cache: a tree another task set left there is not this task's snapshot
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
        text = diff if diff.endswith("\n") or not diff else diff + "\n"
        # surrogateescape: the bytes of a diff read with it (``floe score --diff``) come back exactly; a diff off
        # the wire is valid UTF-8 already (the session runner ships non-UTF-8 files as git binary hunks).
        (inp / "model.patch").write_bytes(text.encode("utf-8", errors="surrogateescape"))
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
        # bwrap, so we hard-copy only the small tree (cheap: tasks are tiny) when the backend needs a src. A task with
        # a base commit and no snapshot raises MaterializeError here: an ERROR (ours, masked), where an empty src
        # used to make "patch did not apply", the agent's failure with reward 0.
        if self.sandbox.name != "docker":
            shutil.copytree(self._pristine(task), src, symlinks=True)

    # ---------------------------------------------------------------------------------------------- grading

    def grade(self, task: Task, diff: str, *, run_empty: bool = False) -> GradeResult:
        t0 = time.monotonic()
        try:
            result = get_evaluator(task.evaluator).grade(task, diff, self, run_empty=run_empty)
        except (UnknownEvaluator, TaskError) as exc:
            result = GradeResult(task.instance_id, Outcome.ERROR, 0.0, False, f"task error: {exc}")
        except Exception as exc:  # a scorer bug must not take the service down; the session is masked
            log.exception("grading crashed", instance_id=task.instance_id)
            result = GradeResult(
                task.instance_id, Outcome.ERROR, 0.0, False, f"scorer error: {type(exc).__name__}: {exc}"
            )
        result.timings_ms["total"] = round((time.monotonic() - t0) * 1000, 1)
        result.isolation = result.isolation or self.sandbox.isolation
        return result

    def run_eval(self, task: Task, diff: str, *, apply_patch: bool) -> SandboxRun:
        """One eval-script run of ``diff`` in the sandbox, for an evaluator (``scorer.evaluators.EvalRunner``)."""
        iid = task.instance_id
        timings: dict[str, float] = {}
        t = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="job-", dir=self.work_dir) as tmp:
            inp = Path(tmp)
            self._prepare_input(task, diff, apply_patch, inp)
            timings["prepare"] = round((time.monotonic() - t) * 1000, 1)
            t = time.monotonic()
            image = task.image or (self.sandbox.image_for(iid) if isinstance(self.sandbox, DockerSandbox) else None)
            res = self.sandbox.run(Job(input_dir=inp, limits=self.limits, image=image, name=iid))
            timings["sandbox"] = round((time.monotonic() - t) * 1000, 1)
        return SandboxRun(
            res.output, res.returncode, res.timed_out, self.limits.wall_s, res.isolation, timings, res.limits_hit
        )
