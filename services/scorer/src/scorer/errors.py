"""Scorer errors.

::

    ScorerError
     └── IsolationUnavailable   (bwrap does not work and unsandboxed grading is not allowed)
"""

from __future__ import annotations

__all__ = ["IsolationUnavailable", "ScorerError"]


class ScorerError(Exception):
    """Root of scorer errors."""


class IsolationUnavailable(ScorerError):
    pass
