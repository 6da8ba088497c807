"""The demo's toy task set: loads by name, materializes, and grades with partial credit for digits."""

from __future__ import annotations

from pathlib import Path

from floe_tasks import TaskSet, answer_patch, score_answer


def test_toy_set_resolves_by_name_and_materializes(tmp_path: Path) -> None:
    toy = TaskSet.from_source("toy")
    assert len(toy) == 25
    task = toy.get("floe__toy-add-2-3")
    assert task.evaluator == "answer" and task.answer == "5" and task.answer_credit == "digits"
    tree = task.materialize(tmp_path / "ws")
    assert (tree / "README.md").is_file()
    assert TaskSet.from_source("bundled") is TaskSet.bundled()


def test_digit_credit_is_dense_and_exact_answer_wins() -> None:
    task = TaskSet.from_source("toy").get("floe__toy-add-2-3")
    assert score_answer(task, answer_patch("5"))[:2] == (1.0, True)
    assert score_answer(task, answer_patch("7"))[:2] == (0.5, False)
    assert score_answer(task, answer_patch("7a"))[:2] == (0.25, False)
    assert score_answer(task, answer_patch("five"))[:2] == (0.0, False)
    assert score_answer(task, "")[:2] == (0.0, False)


def test_exact_credit_has_no_partial_reward() -> None:
    task = TaskSet.from_source("toy").get("floe__toy-add-2-3").model_copy(update={"answer_credit": "exact"})
    assert score_answer(task, answer_patch("7"))[:2] == (0.0, False)
