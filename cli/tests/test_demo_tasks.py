"""``floe demo --tasks FILE``: a user's own task set in place of the workload's, handed to every service as one
absolute ``task_source``, checked before anything starts, and reported task by task."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from contracts import Outcome, RewardPublished, SessionKind, SessionRequested
from floe.cli import main
from floe.demo import Demo, DemoConfig, _Sessions, check_task_sources, eval_answers
from floe_tasks import BUNDLED_DIR


def _user_set(folder: Path, *, with_repos: bool = True) -> Path:
    """Two bundled tasks as a user's file: hub-style JSONL (test lists JSON-encoded) with its repos/ folder."""
    folder.mkdir(parents=True)
    rows = [json.loads(line) for line in (BUNDLED_DIR / "tasks.jsonl").read_text().splitlines()[:2]]
    for row in rows:
        row["FAIL_TO_PASS"], row["PASS_TO_PASS"] = json.dumps(row["FAIL_TO_PASS"]), json.dumps(row["PASS_TO_PASS"])
        if with_repos:
            (folder / "repos").mkdir(exist_ok=True)
            shutil.copy(BUNDLED_DIR / "repos" / f"{row['instance_id']}.bundle", folder / "repos")
    path = folder / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_user_set_reaches_the_rollout_as_one_absolute_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _user_set(tmp_path / "mine")
    monkeypatch.chdir(tmp_path)  # a relative path on the command line, resolved by each service elsewhere
    cfg = DemoConfig.for_model("smollm2", workload="swe", harness="pi", tasks="mine/tasks.jsonl", run_dir=tmp_path)
    assert cfg.task_source == str(path) and Path(cfg.task_source).is_absolute()
    assert cfg.eval_every == 5 and cfg.eval_source is None and cfg.eval_rounds == 0, "no held-out set unless given"
    check_task_sources(cfg)
    demo = Demo(cfg)
    assert [r["task_source"] for r in demo.run_specs()] == [str(path)]
    rollout = next(s for s in demo.services() if s.name == "rollout")
    assert [r["task_source"] for r in json.loads(rollout.env["FLOE_ROLLOUT_RUNS"])] == [str(path)]
    # The session runner and the scorer get no task set of their own: each resolves the task_source of the request
    # (and of the SessionFinished that carries it on), so neither may be pinned to another one.
    for spec in demo.services():
        assert not any(k.endswith("TASK_SOURCE") for k in spec.env), spec.name


def test_a_held_out_set_of_ones_own(tmp_path: Path) -> None:
    train = _user_set(tmp_path / "train")
    heldout = _user_set(tmp_path / "heldout")
    cfg = DemoConfig.for_model(
        "smollm2", workload="swe", tasks=str(train), eval_tasks=str(heldout), steps=10, run_dir=tmp_path
    )
    demo = Demo(cfg)
    assert [(r["name"], r["task_source"]) for r in demo.run_specs()] == [("swe", str(train)), ("heldout", str(heldout))]
    assert cfg.eval_rounds == 3 and demo.eval_tasks() == 2
    assert eval_answers(cfg) == [], "code tasks have no constant answer to compare with"
    with pytest.raises(ValueError, match="--eval-tasks needs --eval-every"):
        DemoConfig.for_model("tiny", workload="swe", tasks=str(train), eval_tasks=str(heldout))
    # Shipped sets keep their names (every service knows them); --eval-tasks replaces the workload's held-out set.
    named = DemoConfig.for_model("smollm2", tasks="count", eval_tasks="count-heldout")
    assert (named.task_source, named.eval_source) == ("count", "count-heldout")


def _broken_set(kind: str, folder: Path) -> Path:
    if kind == "absent":
        return folder / "absent.jsonl"
    if kind == "no-repos":
        return _user_set(folder / "norepos", with_repos=False)
    path = folder / "bad.jsonl"  # a test list that is a plain string, not a JSON list
    path.write_text(json.dumps({"instance_id": "x", "problem_statement": "p", "FAIL_TO_PASS": "t1"}) + "\n")
    return path


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("absent", "cannot read task set"),
        ("no-repos", "has no repository snapshot"),
        ("bad-list", "bad.jsonl:1: invalid instance 'x': FAIL_TO_PASS: a string that is not JSON"),
    ],
)
def test_a_set_that_does_not_load_fails_the_demo_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, message: str
) -> None:
    path = _broken_set(kind, tmp_path)
    run_dir = tmp_path / "run"
    assert main(["demo", "--workload", "swe", "--tasks", str(path), "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("floe demo: ") and message in err
    assert not run_dir.exists(), "nothing was started: no broker, no services, no run directory"


def test_sessions_by_task() -> None:
    seen = _Sessions(0)
    outcomes = {"s1": Outcome.RESOLVED, "s2": Outcome.UNRESOLVED, "s3": Outcome.ERROR, "s4": Outcome.UNRESOLVED}
    for sid, task in (("s1", "a"), ("s2", "a"), ("s3", "b"), ("s4", "b"), ("s5", "c")):
        kind = SessionKind.EVAL if sid == "s4" else SessionKind.TRAIN
        seen.add(SessionRequested(session_id=sid, group_id="g", task_id=task, harness="pi", kind=kind))
        if sid in outcomes:
            ok = outcomes[sid] is Outcome.RESOLVED
            seen.add(
                RewardPublished(
                    session_id=sid, group_id="g", task_id=task, reward=float(ok), outcome=outcomes[sid], resolved=ok
                )
            )
    assert seen.by_task() == {
        "a": {"sessions": 2, "resolved": 1, "errors": 0},
        "b": {"sessions": 2, "resolved": 0, "errors": 1},
    }, "graded sessions only (c was never graded), train and eval together"
