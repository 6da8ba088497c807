"""Scorer errors.

::

    ScorerError
     ├── IsolationUnavailable   (bwrap does not work and unsandboxed grading is not allowed)
     └── UnknownEvaluator       (a task names an evaluator the registry does not have)
"""

from __future__ import annotations

__all__ = ["IsolationUnavailable", "ScorerError", "UnknownEvaluator"]


class ScorerError(Exception):
    """Root of scorer errors."""


class IsolationUnavailable(ScorerError):
    pass


class UnknownEvaluator(ScorerError):
    pass
