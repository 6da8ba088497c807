"""floe scorer: SWE-bench-exact grading of agent diffs in a sandbox.

``Grader.grade(task, diff) -> GradeResult``, through the task's ``Evaluator`` (``EVALUATORS``, by name);
backends behind ``Sandbox`` (``BwrapSandbox``, ``BareSandbox``, ``DockerSandbox``); ``ScorerService`` turns
``SessionFinished`` into ``RewardPublished`` exactly once per session.
"""

from scorer.errors import IsolationUnavailable, ScorerError, UnknownEvaluator
from scorer.evaluators import EVALUATORS, Evaluator, GradeResult, get_evaluator
from scorer.factory import load_taskset, make_grader
from scorer.grader import Grader
from scorer.grading import EvalReport, ResolvedStatus, get_eval_report, get_logs_eval, parse_log_pytest
from scorer.sandbox import BareSandbox, BwrapSandbox, DockerSandbox, ExecResult, Job, Limits, ProbeResult, Sandbox
from scorer.service import ScorerService
from scorer.settings import ScorerSettings

__all__ = [
    "EVALUATORS",
    "BareSandbox",
    "BwrapSandbox",
    "DockerSandbox",
    "EvalReport",
    "Evaluator",
    "ExecResult",
    "GradeResult",
    "Grader",
    "IsolationUnavailable",
    "Job",
    "Limits",
    "ProbeResult",
    "ResolvedStatus",
    "Sandbox",
    "ScorerError",
    "ScorerService",
    "ScorerSettings",
    "UnknownEvaluator",
    "get_eval_report",
    "get_evaluator",
    "get_logs_eval",
    "load_taskset",
    "make_grader",
    "parse_log_pytest",
]
