"""floe task sets: SWE-bench-format instances, the bundled set, and workspace materialization.

Data only, shared by the scorer and the session runner; depends on no service. How a task is graded and what makes
it valid belong to the scorer's evaluator named by ``Task.evaluator`` (``scorer.evaluators``); ``floe score
validate`` (or ``floe tasks validate``) checks a task set.
"""

from floe_tasks.errors import MaterializeError, TaskError, TaskNotFound, TaskSetError
from floe_tasks.task import DEFAULT_TEST_CMD, Task, patch_files
from floe_tasks.taskset import BUNDLED_DIR, COUNT_DIR, NAMED_SETS, TOY_DIR, TaskSet

__all__ = [
    "BUNDLED_DIR",
    "COUNT_DIR",
    "DEFAULT_TEST_CMD",
    "NAMED_SETS",
    "TOY_DIR",
    "MaterializeError",
    "Task",
    "TaskError",
    "TaskNotFound",
    "TaskSet",
    "TaskSetError",
    "patch_files",
]
