"""The evaluator seam: what every evaluator implements, what it may ask of the grader, and what it returns.

An ``Evaluator`` owns one kind of task (``Task.evaluator`` names it): how a diff is graded, what a well-formed task
of that kind looks like, and which diffs prove a task gradable. It holds no state, so one instance serves every
grading thread. The ``Grader`` owns the sandbox and hands itself to ``grade`` as an ``EvalRunner``: an evaluator
that needs code run asks for one eval-script run and interprets the output; one that does not (``answer``) never
touches it. Evaluators therefore never import a sandbox backend.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from contracts import Outcome
from floe_tasks import Task, TaskError
from sandbox import LimitHit

__all__ = ["EvalRunner", "Evaluator", "GradeResult", "SandboxRun", "materialize_problems"]


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


@dataclass(frozen=True)
class SandboxRun:
    """One run of a task's eval script (``scorer.evalscript``) on a diff, as the grader reports it."""

    output: str  # stdout and stderr merged: the script's markers are echoed on stderr
    returncode: int | None
    timed_out: bool
    wall_s: float  # the wall-clock limit it ran under
    isolation: str
    timings_ms: dict[str, float]
    limits_hit: tuple[LimitHit, ...] = ()  # the sandbox's limits that fired, most telling first (bwrap backend)


class EvalRunner(Protocol):
    """The grader's side of the seam."""

    @property
    def max_diff_bytes(self) -> int: ...

    def run_eval(self, task: Task, diff: str, *, apply_patch: bool) -> SandboxRun:
        """Run the eval script in the sandbox; ``apply_patch=False`` runs the tests on the pristine tree."""
        ...


class Evaluator(Protocol):
    """One kind of task. Registered by name in ``scorer.evaluators.EVALUATORS``."""

    def grade(self, task: Task, diff: str, runner: EvalRunner, *, run_empty: bool = False) -> GradeResult:
        """Grade ``diff`` (the agent's change to the workspace) against ``task``.

        ``run_empty``: an empty diff is still run through the full check instead of being rejected up front
        (validation proves an untouched task fails its own tests). A fault of ours (not the diff's) is
        ``Outcome.ERROR``, or a raised ``TaskError``, which the grader turns into one.
        """
        ...

    def validate(self, task: Task) -> list[str]:
        """What is wrong with the task's data for this evaluator, one line per problem; no grading."""
        ...

    def checks(self, task: Task) -> dict[str, str]:
        """The diffs that prove the task gradable, by check name: ``gold`` must resolve, every other must not."""
        ...


def materialize_problems(task: Task) -> list[str]:
    """Whether the agent's workspace can be built (the snapshot at ``base_commit``, or an empty repository)."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            task.materialize(Path(tmp) / "w")
        except TaskError as exc:
            return [f"cannot materialize: {exc}"]
    return []
