"""The ``answer`` evaluator: a toy verifiable task graded without running any code.

The agent writes its answer to ``answer.txt`` at the workspace root; the diff's new content of that file is compared
with ``Task.answer`` (whitespace-trimmed, case-sensitive). ``Task.answer_credit`` picks the reward: ``exact`` (1 or 0
on the whole answer), ``first_number`` (1 or 0 on the first integer in the answer: the real-model demo's ``count``
tasks, where "48, the number after 47" is right and "The number after 47 is 48" is not) or ``digits`` (the tiny
model's toy tasks: partial credit for answering in digits, see ``score_answer``). No sandbox, no
tests: ``apply_status`` is ``not applicable``.

Validation: the task carries an ``answer``, its workspace materializes; then the gold diff (``patch``, else the diff
that writes the answer) resolves and the empty diff does not.
"""

from __future__ import annotations

import re

from contracts import Outcome
from floe_tasks import Task
from scorer.evaluators.base import EvalRunner, GradeResult, materialize_problems

__all__ = ["ANSWER_FILE", "AnswerEvaluator", "answer_from_diff", "answer_patch", "grade_answer", "score_answer"]

ANSWER_FILE = "answer.txt"
_INTEGER = re.compile(r"[-+]?\d+")


def answer_from_diff(diff: str, filename: str = ANSWER_FILE) -> str | None:
    """The content the diff leaves in ``filename`` when it creates or rewrites it; None when it does not touch it.

    Only whole-file content is reconstructed: the added lines of the hunks for that file (a rewrite of a one-line
    answer file is a ``-old`` / ``+new`` pair, so the added lines are the new content).
    """
    lines: list[str] | None = None
    current: str | None = None
    for line in diff.splitlines():
        if line.startswith("diff --git "):
            current = None
            continue
        if line.startswith("+++ "):
            target = line[4:].strip()
            current = target[2:] if target.startswith("b/") else target
            if current == filename:
                lines = []
            continue
        if line.startswith("--- ") or line.startswith("@@"):
            continue
        if current == filename and lines is not None and line.startswith("+"):
            lines.append(line[1:])
    return None if lines is None else "\n".join(lines)


def answer_patch(answer: str, filename: str = ANSWER_FILE) -> str:
    """The diff an agent produces by writing ``answer`` to ``filename`` (the gold patch of an ``answer`` task)."""
    lines = answer.splitlines() or [""]
    body = "".join(f"+{line}\n" for line in lines)
    return (
        f"diff --git a/{filename} b/{filename}\nnew file mode 100644\n--- /dev/null\n+++ b/{filename}\n"
        f"@@ -0,0 +1,{len(lines)} @@\n{body}"
    )


def grade_answer(task: Task, diff: str) -> tuple[bool, str]:
    """Grade an ``answer`` task: (correct, reason). Whitespace around the answer is ignored, case is not."""
    if task.answer is None:
        raise ValueError(f"task {task.instance_id} has no expected answer")
    given = answer_from_diff(diff)
    if given is None:
        return False, f"the diff does not write {ANSWER_FILE}"
    if task.answer_credit == "first_number":
        # A wrong answer's reason says what was answered (a run whose solve rate collapses is read from these).
        found = _INTEGER.search(given)
        if found is None:
            return False, f"the answer holds no number: {_quote(given)}"
        first = _integer_text(found.group(0))
        if first == _integer_text(task.answer.strip()):
            return True, "first number matches"
        return False, f"first number {_quote(first, 24)} does not match: {_quote(given)}"
    if given.strip() == task.answer.strip():
        return True, "answer matches"
    return False, "answer does not match"


def _integer_text(number: str) -> str:
    """An integer's canonical digits ("+048" -> "48", "-0" -> "0"), compared as text: ``int()`` refuses numbers of more
    than 4,300 digits, and a model may well answer with one."""
    digits = number.lstrip("+-").lstrip("0") or "0"
    return "-" + digits if number.startswith("-") and digits != "0" else digits


def _quote(given: str, limit: int = 40) -> str:
    """The start of an answer, quoted, for a reason (untrusted text: bounded, escapes visible)."""
    text = given.strip()
    return repr(text[:limit] + "…" if len(text) > limit else text)


def score_answer(task: Task, diff: str) -> tuple[float, bool, str]:
    """Reward of an ``answer`` task: (reward, correct, reason).

    ``answer_credit="exact"`` / ``"first_number"``: 1 if correct, else 0. ``"digits"`` (the tiny model's toy tasks)
    adds partial credit so a tiny random model has a dense enough signal: a wrong answer earns 0.5 x the fraction of
    its characters that are digits (an empty answer earns 0). A correct answer always earns 1.
    """
    correct, reason = grade_answer(task, diff)
    if correct or task.answer_credit != "digits":
        return (1.0 if correct else 0.0), correct, reason
    given = (answer_from_diff(diff) or "").strip()
    if not given:
        return 0.0, False, reason
    fraction = sum(ch.isdigit() for ch in given) / len(given)
    return round(0.5 * fraction, 6), False, f"{reason}; partial credit for digits {fraction:.2f}"


class AnswerEvaluator:
    def grade(self, task: Task, diff: str, runner: EvalRunner, *, run_empty: bool = False) -> GradeResult:
        reward, ok, why = score_answer(task, diff)
        outcome = Outcome.RESOLVED if ok else Outcome.UNRESOLVED
        return GradeResult(task.instance_id, outcome, reward, ok, why, apply_status="not applicable")

    def validate(self, task: Task) -> list[str]:
        problems: list[str] = []
        if task.answer is None:
            problems.append("answer task without 'answer'")
        elif task.answer_credit == "first_number" and not re.fullmatch(r"[-+]?\d+", task.answer.strip()):
            problems.append(f"first_number task whose answer {task.answer!r} is not an integer")
        return problems + materialize_problems(task)

    def checks(self, task: Task) -> dict[str, str]:
        return {"gold": task.patch or answer_patch(task.answer or ""), "empty": ""}
