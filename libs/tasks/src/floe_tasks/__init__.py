"""floe task sets: SWE-bench-format instances, the bundled set, and workspace materialization.

Shared by the scorer and the gateway's session runner; depends on no service.
"""

from floe_tasks.errors import MaterializeError, TaskError, TaskNotFound, TaskSetError
from floe_tasks.task import (
    ANSWER_FILE,
    DEFAULT_TEST_CMD,
    Task,
    answer_from_diff,
    answer_patch,
    grade_answer,
    patch_files,
    score_answer,
)
from floe_tasks.taskset import BUNDLED_DIR, NAMED_SETS, TOY_DIR, TaskSet

__all__ = [
    "ANSWER_FILE",
    "BUNDLED_DIR",
    "DEFAULT_TEST_CMD",
    "NAMED_SETS",
    "TOY_DIR",
    "MaterializeError",
    "Task",
    "TaskError",
    "TaskNotFound",
    "TaskSet",
    "TaskSetError",
    "answer_from_diff",
    "answer_patch",
    "grade_answer",
    "patch_files",
    "score_answer",
]
