"""Task model, loaders, digest, materialization and the ``floe tasks`` CLI."""

from __future__ import annotations

import json
import subprocess
import types
from pathlib import Path

import pytest

import floe_tasks
from floe_tasks import (
    MaterializeError,
    Task,
    TaskNotFound,
    TaskSet,
    TaskSetError,
    patch_files,
)
from floe_tasks.cli import main


def test_exported_members() -> None:
    public = {n for n, v in vars(floe_tasks).items() if not n.startswith("_") and not isinstance(v, types.ModuleType)}
    assert set(floe_tasks.__all__) == public


def test_bundled_set_shape() -> None:
    ts = TaskSet.bundled()
    assert len(ts) >= 24
    assert ts.ids() == sorted(ts.ids())
    repos = {t.repo for t in ts}
    assert len(repos) == len(ts)  # every task is its own repository
    multi_file = [t for t in ts if len([p for p in patch_files(t.patch)]) > 1]
    assert len(multi_file) >= 3
    for task in ts:
        assert task.instance_id.startswith("floe__") and task.evaluator == "swebench"
        assert task.FAIL_TO_PASS and task.snapshot is not None and task.snapshot.is_file()
        assert not set(task.FAIL_TO_PASS) & set(task.PASS_TO_PASS)
        assert all(p.startswith("tests/") for p in task.test_files)
        assert not any(p.startswith("tests/") for p in patch_files(task.patch))
    assert ts.get(ts.ids()[0]) is next(iter(ts))
    assert TaskSet.bundled() is ts


def test_unknown_id() -> None:
    with pytest.raises(TaskNotFound, match="nope"):
        TaskSet.bundled().get("nope")


def test_swebench_json_string_lists_and_extra_columns(tmp_path: Path) -> None:
    row = {
        "instance_id": "a__b-1",
        "repo": "a/b",
        "base_commit": "0" * 40,
        "problem_statement": "p",
        "FAIL_TO_PASS": '["t::a"]',
        "PASS_TO_PASS": "[]",
        "difficulty": "easy",  # v5/Verified extras are ignored
    }
    path = tmp_path / "set.jsonl"
    path.write_text(json.dumps(row) + "\n\n")
    ts = TaskSet.from_jsonl(path)
    task = ts.get("a__b-1")
    assert task.FAIL_TO_PASS == ["t::a"] and task.PASS_TO_PASS == []
    assert task.snapshot is None
    with pytest.raises(MaterializeError, match="no repository snapshot"):
        task.materialize(tmp_path / "w")
    path.write_text("{not json\n")
    with pytest.raises(TaskSetError, match=":1:"):
        TaskSet.from_jsonl(path)
    path.write_text((json.dumps(row) + "\n") * 2)
    with pytest.raises(TaskSetError, match="duplicate"):
        TaskSet.from_jsonl(path)


def test_digest_tracks_content(tmp_path: Path) -> None:
    bundled = TaskSet.bundled()
    src = Path(floe_tasks.BUNDLED_DIR)
    copy = tmp_path / "tasks.jsonl"
    copy.write_text((src / "tasks.jsonl").read_text())
    same = TaskSet.from_jsonl(copy, repos_dir=src / "repos")
    assert same.digest == bundled.digest
    rows = [json.loads(line) for line in copy.read_text().splitlines()]
    rows[0]["PASS_TO_PASS"] = []
    copy.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert TaskSet.from_jsonl(copy, repos_dir=src / "repos").digest != bundled.digest


def test_materialize_is_base_commit_without_hidden_parts(tmp_path: Path) -> None:
    task = TaskSet.bundled().get("floe__containers-31")
    tree = task.materialize(tmp_path / "ws")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tree, capture_output=True, text=True).stdout.strip()
    assert head == task.base_commit
    assert subprocess.run(["git", "remote"], cwd=tree, capture_output=True, text=True).stdout == ""
    log = subprocess.run(["git", "log", "--all", "--oneline"], cwd=tree, capture_output=True, text=True).stdout
    assert len(log.splitlines()) == 1  # no fix commit anywhere in the history
    assert not (tree / "tests" / "test_empty.py").exists()  # created by the hidden test patch
    assert not (tree / "containers" / "errors.py").exists()  # created by the gold patch
    assert subprocess.run(["git", "apply", "--check", "-"], cwd=tree, input=task.patch, text=True).returncode == 0
    with pytest.raises(MaterializeError, match="not empty"):
        task.materialize(tree)


def test_a_task_without_base_commit_gets_an_empty_repository(tmp_path: Path) -> None:
    # an ``answer`` task needs no repository; the agent still gets a git workspace to diff against
    task = Task(instance_id="toy__sum-1", problem_statement="What is 2+3?", evaluator="answer", answer="5")
    tree = task.materialize(tmp_path / "toy")
    log = subprocess.run(["git", "log", "--oneline"], cwd=tree, capture_output=True, text=True, check=True).stdout
    assert len(log.splitlines()) == 1 and [p.name for p in tree.iterdir()] == [".git"]


def test_evaluator_is_a_name_the_library_does_not_interpret() -> None:
    # the scorer's registry decides which names exist; loading never rejects one
    assert Task(instance_id="x", problem_statement="p", evaluator="some-future-evaluator").evaluator == (
        "some-future-evaluator"
    )


def test_cli_list_and_show(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert len(out.strip().splitlines()) == len(TaskSet.bundled())
    assert main(["show", "floe__pager-3"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["instance_id"] == "floe__pager-3" and "patch" not in shown and "test_patch" not in shown
    assert main(["show", "floe__pager-3", "--with-solution"]) == 0
    assert "patch" in json.loads(capsys.readouterr().out)
    assert main(["show", "missing"]) == 2


def test_validation_is_not_a_library_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):  # the floe CLI routes `floe tasks validate` to the scorer
        main(["validate"])
    assert "invalid choice: 'validate'" in capsys.readouterr().err
