"""Isolation probe, refusal to run unsandboxed, and ``floe score``."""

from __future__ import annotations

from pathlib import Path

import pytest

from floe_tasks import TaskSet
from scorer.cli import main
from scorer.errors import IsolationUnavailable
from scorer.factory import make_grader
from scorer.settings import ScorerSettings


def test_refuses_without_isolation(settings: ScorerSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")  # bwrap cannot be found
    with pytest.raises(IsolationUnavailable, match="FLOE_SCORER_ALLOW_UNSANDBOXED"):
        make_grader(settings)
    grader, probe = make_grader(settings.model_copy(update={"allow_unsandboxed": True}))
    assert probe.level == "C" and grader.sandbox.isolation == "C"


def test_floe_score_prints_the_report(
    scorer_work: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLOE_SCORER_WORK_DIR", str(scorer_work))
    task = TaskSet.bundled().get("floe__pager-3")
    gold = tmp_path / "gold.diff"
    gold.write_text(task.patch)
    assert main(["--task", task.instance_id, "--diff", str(gold)]) == 0
    out = capsys.readouterr().out
    assert "floe__pager-3: resolved (reward 1)" in out and "isolation: A" in out
    bad = tmp_path / "bad.diff"
    bad.write_text("garbage\n")
    assert main(["--task", task.instance_id, "--diff", str(bad), "--json"]) == 1
    assert '"reason": "patch did not apply"' in capsys.readouterr().out
    assert main(["--task", "nope__nope-1", "--diff", str(bad)]) == 2
