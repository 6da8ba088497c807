"""Task-set validation, by each task's evaluator (``scorer.evaluators``).

``task_problems``: what is wrong with a task's data (no grading). ``validate_taskset``: grade the evaluator's
``checks`` for every instance (``swebench``: gold -> resolved, empty diff -> unresolved, test patch alone ->
unresolved; ``answer``: gold -> resolved, empty -> unresolved). Runs instances concurrently; results are cached by
task-set digest (and the grading configuration), so a restart or a second ``make test`` run does not regrade an
unchanged set. ``floe score validate`` (also spelled ``floe tasks validate``) runs both.
"""

from __future__ import annotations

import hashlib
import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from contracts import Outcome
from floe_tasks import Task, TaskSet
from scorer.errors import UnknownEvaluator
from scorer.evaluators import get_evaluator
from scorer.grader import Grader

__all__ = ["InstanceValidation", "task_problems", "validate_taskset"]


@dataclass
class InstanceValidation:
    instance_id: str
    ok: bool
    verdicts: dict[str, str]  # check -> outcome
    problems: list[str]
    seconds: float


def task_problems(task: Task) -> list[str]:
    """What is wrong with the task's data by its evaluator's rules, one line per problem."""
    try:
        return get_evaluator(task.evaluator).validate(task)
    except UnknownEvaluator as exc:
        return [str(exc)]


def _validate_one(grader: Grader, task: Task) -> InstanceValidation:
    t0 = time.monotonic()
    problems: list[str] = []
    verdicts: dict[str, str] = {}
    try:
        checks = get_evaluator(task.evaluator).checks(task)
    except UnknownEvaluator as exc:
        return InstanceValidation(task.instance_id, False, {}, [str(exc)], 0.0)
    for check, diff in checks.items():
        res = grader.grade(task, diff, run_empty=True)
        verdicts[check] = res.outcome.value
        want = Outcome.RESOLVED if check == "gold" else Outcome.UNRESOLVED
        if res.outcome is not want:
            problems.append(f"{check}: expected {want.value}, got {res.outcome.value} ({res.reason})")
    return InstanceValidation(task.instance_id, not problems, verdicts, problems, round(time.monotonic() - t0, 2))


def validate_taskset(
    taskset: TaskSet, grader: Grader, *, workers: int = 2, cache_dir: Path | None = None
) -> list[InstanceValidation]:
    """Validate every instance; a cached all-green result for the same digest is returned without regrading."""
    key = hashlib.sha256(f"{taskset.digest}:{grader.sandbox.name}:{grader.protect_test_infra}".encode()).hexdigest()
    cache = (cache_dir / f"validation-{key[:16]}.json") if cache_dir is not None else None
    if cache is not None and cache.exists():
        return [InstanceValidation(**row) for row in json.loads(cache.read_text())]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        rows = list(pool.map(lambda t: _validate_one(grader, t), list(taskset)))
    if cache is not None and all(r.ok for r in rows):  # only green results are worth reusing
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps([asdict(r) for r in rows]))
    return rows
