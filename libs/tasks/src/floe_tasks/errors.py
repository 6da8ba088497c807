"""Errors of ``floe_tasks``.

::

    TaskError
     ├── TaskNotFound        (also a KeyError: unknown instance id)
     ├── TaskSetError        (unreadable or invalid JSONL, duplicate ids)
     └── MaterializeError    (the repository snapshot could not be checked out)
"""

from __future__ import annotations

__all__ = ["MaterializeError", "TaskError", "TaskNotFound", "TaskSetError"]


class TaskError(Exception):
    """Root of every floe_tasks error."""


class TaskNotFound(TaskError, KeyError):
    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else "task not found"


class TaskSetError(TaskError):
    pass


class MaterializeError(TaskError):
    pass
