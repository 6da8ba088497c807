"""``floe score validate`` (also ``floe tasks validate``) over every bundled instance: gold -> resolved, empty ->
unresolved, test patch alone -> unresolved, graded in the bwrap sandbox. The result is cached by task-set digest."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from floe_tasks import TaskSet
from scorer.cli import main as score_main
from scorer.grader import Grader
from scorer.validation import validate_taskset


@pytest.mark.slow
def test_every_bundled_instance_validates(grader: Grader, capsys: pytest.CaptureFixture[str]) -> None:
    ts = TaskSet.bundled()
    assert len(ts) >= 24
    t0 = time.monotonic()
    rows = validate_taskset(ts, grader, workers=2, cache_dir=grader.work_dir)
    took = time.monotonic() - t0
    bad = [(r.instance_id, r.problems) for r in rows if not r.ok]
    assert bad == []
    assert {r.instance_id for r in rows} == set(ts.ids())
    print(f"validated {len(rows)} instances in {took:.1f}s")
    # second run: served from the digest-keyed cache
    t1 = time.monotonic()
    again = validate_taskset(ts, grader, workers=2, cache_dir=grader.work_dir)
    assert [r.instance_id for r in again] == [r.instance_id for r in rows]
    assert time.monotonic() - t1 < 1.0


def test_validate_cli_structure_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert score_main(["validate", "--source", "bundled", "--no-grade"]) == 0
    assert "structure ok: 24 tasks" in capsys.readouterr().out


def test_validate_cli_grades_and_reports_bad_tasks(
    scorer_work: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLOE_SCORER_WORK_DIR", str(scorer_work))
    monkeypatch.setenv("FLOE_SCORER_TASK_SOURCE", "toy")  # the default source comes from the scorer's settings
    assert score_main(["validate", "--no-cache"]) == 0
    out = capsys.readouterr().out
    assert "structure ok: 25 tasks" in out and "graded 25 tasks" in out and ": 0 failing" in out
    assert "ok   floe__toy-add-2-3 {'gold': 'resolved', 'empty': 'unresolved'}" in out
    path = tmp_path / "bad.jsonl"
    path.write_text(
        json.dumps({"instance_id": "a", "problem_statement": "p", "evaluator": "answer"})
        + "\n"
        + json.dumps({"instance_id": "b", "problem_statement": "p", "evaluator": "typo"})
        + "\n"
    )
    assert score_main(["validate", "--source", str(path), "--no-grade"]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "FAIL a: answer task without 'answer'",
        "FAIL b: unknown evaluator 'typo' (known: answer, swebench)",
    ]
    assert score_main(["validate", "--source", str(tmp_path / "missing.jsonl"), "--no-grade"]) == 2


def test_answer_task_set_validates(grader: Grader, tmp_path: Path) -> None:
    rows = [
        {
            "instance_id": f"toy__add-{i}",
            "problem_statement": f"What is {i}+1? Write it to answer.txt.",
            "evaluator": "answer",
            "answer": str(i + 1),
        }
        for i in range(3)
    ]
    path = tmp_path / "toy.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = validate_taskset(TaskSet.from_jsonl(path), grader, workers=2)
    assert [r.verdicts for r in result] == [{"gold": "resolved", "empty": "unresolved"}] * 3
