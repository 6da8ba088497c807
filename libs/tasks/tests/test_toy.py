"""The demo's toy task set: loads by name and materializes (its grading is the scorer's ``answer`` evaluator)."""

from __future__ import annotations

from pathlib import Path

from floe_tasks import TaskSet


def test_toy_set_resolves_by_name_and_materializes(tmp_path: Path) -> None:
    toy = TaskSet.from_source("toy")
    assert len(toy) == 25
    task = toy.get("floe__toy-add-2-3")
    assert task.evaluator == "answer" and task.answer == "5" and task.answer_credit == "digits"
    tree = task.materialize(tmp_path / "ws")
    assert (tree / "README.md").is_file()
    assert TaskSet.from_source("bundled") is TaskSet.bundled()
