"""Evaluators by name: the one place a task's ``evaluator`` string is resolved.

``get_evaluator(task.evaluator)`` is how the grader, validation and the CLI reach an evaluator; nothing else
branches on the name. Adding one: a module here implementing ``Evaluator`` (``base.py``), one line in
``EVALUATORS``, and its tests (see the scorer README).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from scorer.errors import UnknownEvaluator
from scorer.evaluators.answer import AnswerEvaluator
from scorer.evaluators.base import EvalRunner, Evaluator, GradeResult, SandboxRun
from scorer.evaluators.swebench import SwebenchEvaluator

__all__ = ["EVALUATORS", "EvalRunner", "Evaluator", "GradeResult", "SandboxRun", "get_evaluator"]

# Read-only: evaluators are stateless and shared by every grading thread.
EVALUATORS: Mapping[str, Evaluator] = MappingProxyType(
    {
        "swebench": SwebenchEvaluator(),
        "answer": AnswerEvaluator(),
    }
)


def get_evaluator(name: str) -> Evaluator:
    try:
        return EVALUATORS[name]
    except KeyError:
        raise UnknownEvaluator(f"unknown evaluator {name!r} (known: {', '.join(sorted(EVALUATORS))})") from None
