"""The evaluator registry and the ``answer`` evaluator (the ``swebench`` one is graded for real in the other files)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from contracts import Outcome
from floe_tasks import NAMED_SETS, Task, TaskSet
from scorer.errors import UnknownEvaluator
from scorer.evaluators import EVALUATORS, get_evaluator
from scorer.evaluators.answer import answer_from_diff, answer_patch, grade_answer, score_answer
from scorer.grader import Grader
from scorer.sandbox import BareSandbox, Limits
from scorer.validation import task_problems, validate_taskset


@pytest.fixture
def bare_grader(tmp_path: Path) -> Grader:
    # Only for paths that never run the sandbox (answer tasks, unknown evaluators): no bwrap probe needed.
    return Grader(BareSandbox(), None, tmp_path / "work", Limits(wall_s=10))


def _task(evaluator: str, **fields: object) -> Task:
    return Task.model_validate({"instance_id": "t__x-1", "problem_statement": "p", "evaluator": evaluator, **fields})


@pytest.mark.parametrize("name", sorted(NAMED_SETS))
def test_every_evaluator_of_the_shipped_sets_is_registered(name: str) -> None:
    used = {task.evaluator for task in TaskSet.from_source(name)}
    assert used and used <= set(EVALUATORS)


def test_unknown_evaluator_is_a_clear_error_naming_the_known_ones(bare_grader: Grader) -> None:
    with pytest.raises(UnknownEvaluator, match=r"unknown evaluator 'nope' \(known: answer, swebench\)"):
        get_evaluator("nope")
    task = _task("nope")
    assert task_problems(task) == ["unknown evaluator 'nope' (known: answer, swebench)"]
    result = bare_grader.grade(task, "diff")
    assert result.outcome is Outcome.ERROR and result.reward == 0.0
    assert result.reason == "task error: unknown evaluator 'nope' (known: answer, swebench)"
    (row,) = validate_taskset(TaskSet([task]), bare_grader)
    assert not row.ok and row.problems == ["unknown evaluator 'nope' (known: answer, swebench)"]


def test_each_evaluator_checks_its_own_task_data() -> None:
    assert task_problems(_task("answer")) == ["answer task without 'answer'"]
    assert task_problems(_task("answer", answer="5")) == []
    # a commit to check out and no snapshot to check it out from: the agent would get no workspace
    assert task_problems(_task("answer", answer="5", base_commit="0" * 40))[0].startswith("cannot materialize")
    swe = task_problems(_task("swebench"))
    assert "no repository snapshot (bundle) found" in swe and "FAIL_TO_PASS is empty" in swe
    assert all(task_problems(task) == [] for task in TaskSet.from_source("toy"))


def test_answer_is_read_from_the_diff(tmp_path: Path) -> None:
    task = _task("answer", answer="5")
    tree = task.materialize(tmp_path / "toy")
    (tree / "answer.txt").write_text("5\n")
    subprocess.run(["git", "add", "-N", "."], cwd=tree, check=True)
    diff = subprocess.run(["git", "diff"], cwd=tree, capture_output=True, text=True).stdout
    assert answer_from_diff(diff) == "5"
    assert grade_answer(task, diff) == (True, "answer matches")
    assert grade_answer(task, diff.replace("+5", "+6"))[0] is False
    assert grade_answer(task, "")[0] is False
    assert grade_answer(task, answer_patch("5"))[0] is True
    assert answer_from_diff(answer_patch("a\nb")) == "a\nb"
    rewrite = "--- a/answer.txt\n+++ b/answer.txt\n@@ -1 +1 @@\n-4\n+ 5 \n"
    assert grade_answer(task, rewrite)[0] is True


def test_digit_credit_is_dense_and_exact_answer_wins() -> None:
    task = TaskSet.from_source("toy").get("floe__toy-add-2-3")
    assert score_answer(task, answer_patch("5"))[:2] == (1.0, True)
    assert score_answer(task, answer_patch("7"))[:2] == (0.5, False)
    assert score_answer(task, answer_patch("7a"))[:2] == (0.25, False)
    assert score_answer(task, answer_patch("five"))[:2] == (0.0, False)
    assert score_answer(task, "")[:2] == (0.0, False)
    exact = task.model_copy(update={"answer_credit": "exact"})
    assert score_answer(exact, answer_patch("7"))[:2] == (0.0, False)


def test_first_number_credit_is_exact_on_the_first_integer_only() -> None:
    task = TaskSet.from_source("count-heldout").get("floe__count-next-47")
    assert task.answer == "48" and task.answer_credit == "first_number"
    assert score_answer(task, answer_patch("48"))[:2] == (1.0, True)
    assert score_answer(task, answer_patch("48, also known as forty-eight"))[:2] == (1.0, True)
    assert score_answer(task, answer_patch("+48."))[:2] == (1.0, True)
    # The answer must come first: prose that restates the question first earns nothing, and there is no format credit.
    assert score_answer(task, answer_patch("The number after 47 is 48"))[:3] == (
        0.0,
        False,
        "first number '47' does not match: 'The number after 47 is 48'",
    )
    assert score_answer(task, answer_patch("49"))[:2] == (0.0, False)
    assert score_answer(task, answer_patch("forty-eight"))[:3] == (
        0.0,
        False,
        "the answer holds no number: 'forty-eight'",
    )
    assert score_answer(task, answer_patch("0048"))[:2] == (1.0, True)
    assert score_answer(task, answer_patch("-48"))[:2] == (0.0, False)
    # A number too long for int() is a wrong answer, not a grading error; what a reason quotes of it is bounded.
    huge = score_answer(task, answer_patch("9" * 5000))
    assert huge[:2] == (0.0, False) and len(huge[2]) < 120, huge[2][:200]
    long = "The answer is a special number, " * 10
    reason = score_answer(task, answer_patch(long))[2]
    assert reason == "the answer holds no number: 'The answer is a special number, The answ…'"
    assert score_answer(task, "")[:2] == (0.0, False)


def test_count_sets_hold_out_numbers_never_trained_on() -> None:
    train, heldout = TaskSet.from_source("count"), TaskSet.from_source("count-heldout")

    def numbers(ts: TaskSet) -> set[int]:
        return {int(t.instance_id.rsplit("-", 1)[1]) for t in ts}

    assert len(list(heldout)) == 40 and len(list(train)) == 136
    assert not numbers(train) & numbers(heldout)
    # The best a prompt-agnostic (constant) answer can do on the held-out set: the demo reports against it.
    answers = [t.answer for t in heldout]
    assert max(answers.count(a) for a in set(answers)) <= 2


def test_answer_tasks_grade_without_the_sandbox(bare_grader: Grader) -> None:
    task = TaskSet.from_source("toy").get("floe__toy-add-2-3")
    right = bare_grader.grade(task, answer_patch("5"))
    assert (right.outcome, right.reward, right.apply_status) == (Outcome.RESOLVED, 1.0, "not applicable")
    wrong = bare_grader.grade(task, answer_patch("7"))
    assert (wrong.outcome, wrong.reward) == (Outcome.UNRESOLVED, 0.5)
    assert not (bare_grader.work_dir / "src").exists()  # nothing was materialized for a sandbox


def test_validation_names_listed_tests_the_eval_never_runs() -> None:
    # A user's instance listed PASS_TO_PASS tests in files its test patch does not touch: the eval runs only the test
    # patch's files (as SWE-bench does), they were never collected, and the gold patch read as "PASS_TO_PASS broken".
    task = next(t for t in TaskSet.from_source("bundled") if t.evaluator == "swebench")
    (run,) = task.test_files[:1]
    assert task_problems(task) == []
    other = task.model_copy(
        update={"PASS_TO_PASS": [*task.PASS_TO_PASS, "tests/test_other.py::test_a", "tests/test_other.py::test_b"]}
    ).with_snapshot(task.snapshot)
    (problem,) = task_problems(other)
    assert problem.startswith("2 PASS_TO_PASS test(s) in tests/test_other.py, which the eval never runs")
    assert run in problem
    # ids of other styles name no file: not flagged
    django = task.model_copy(update={"PASS_TO_PASS": ["test_x (app.tests.Case)"]}).with_snapshot(task.snapshot)
    assert task_problems(django) == []
