"""floe scorer: SWE-bench-exact grading of agent diffs in a sandbox.

``Grader.grade(task, diff) -> GradeResult``; backends behind ``Sandbox`` (``BwrapSandbox``, ``BareSandbox``,
``DockerSandbox``); ``ScorerService`` turns ``SessionFinished`` into ``RewardPublished`` exactly once per session.
"""

from scorer.errors import IsolationUnavailable, ScorerError
from scorer.factory import load_taskset, make_grader
from scorer.grader import Grader, GradeResult
from scorer.grading import EvalReport, ResolvedStatus, get_eval_report, get_logs_eval, parse_log_pytest
from scorer.sandbox import BareSandbox, BwrapSandbox, DockerSandbox, ExecResult, Job, Limits, ProbeResult, Sandbox
from scorer.service import ScorerService
from scorer.settings import ScorerSettings

__all__ = [
    "BareSandbox",
    "BwrapSandbox",
    "DockerSandbox",
    "EvalReport",
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
    "get_eval_report",
    "get_logs_eval",
    "load_taskset",
    "make_grader",
    "parse_log_pytest",
]
