from __future__ import annotations

import json
import random
from datetime import UTC, datetime
from pathlib import Path

import pytest

from contracts import Event, ModelCallRecorded
from rollout.cli import main
from rollout.replay import load_events_jsonl, parse_bound, rebuild, write_result

from .simulate import SessionPlan, simulate_group


def _write_jsonl(path: Path, events: list[Event], wrapped: bool) -> None:
    with path.open("w") as fh:
        for e in events:
            body = json.loads(e.model_dump_json())
            fh.write(json.dumps({"type": type(e).__name__, "event": body} if wrapped else body) + "\n")


def _events(seed: int) -> list[Event]:
    rng = random.Random(seed)
    events: list[Event] = []
    for g in range(3):
        events += simulate_group(
            f"g{g}", [SessionPlan(reward=1.0), SessionPlan(reward=0.0), SessionPlan(reward=0.5)], rng
        )
    return events


def test_replay_rebuild_cli_is_byte_identical_whatever_the_event_order(tmp_path: Path) -> None:
    events = _events(7)
    shuffled = list(events)
    random.Random(1).shuffle(shuffled)
    _write_jsonl(tmp_path / "a.jsonl", events, wrapped=False)
    _write_jsonl(tmp_path / "b.jsonl", shuffled, wrapped=True)
    for name in ("a", "b"):
        rc = main(
            [
                "replay-rebuild",
                "--jsonl",
                str(tmp_path / f"{name}.jsonl"),
                "--builder",
                "prefix_merging",
                "--out",
                str(tmp_path / f"out-{name}"),
                "--groups-per-batch",
                "2",
            ]
        )
        assert rc == 0
    files_a = sorted(p.name for p in (tmp_path / "out-a").iterdir())
    files_b = sorted(p.name for p in (tmp_path / "out-b").iterdir())
    assert files_a == files_b and len([f for f in files_a if f.endswith(".arrow")]) == 2
    for name in files_a:
        assert (tmp_path / "out-a" / name).read_bytes() == (tmp_path / "out-b" / name).read_bytes()
    summary = json.loads((tmp_path / "out-a" / "summary.json").read_text())
    assert summary["groups"] == 3 and summary["reconstruction"]["breaks"] == 0


def test_replay_keeps_sessions_that_never_finished_as_masked_rows(tmp_path: Path) -> None:
    calls_only = [e for e in _events(3) if isinstance(e, ModelCallRecorded)]
    result = rebuild(calls_only, builder="per_request")
    assert result.closed_sessions == 9 and len(result.groups) == 9
    rows = [r for g in result.groups for r in g.rows]
    assert len(rows) == len(calls_only)  # per_request: one row per call, none dropped
    assert all(r.masked_reason and not any(r.loss_mask) for r in rows)
    write_result(result, tmp_path)
    assert (tmp_path / "batches.jsonl").read_text().count("\n") == 9


def test_bounds_and_bad_input() -> None:
    assert parse_bound("42").offset == 42
    when = datetime(2026, 11, 30, 1, 0, tzinfo=UTC)
    assert parse_bound("2026-11-30T01:00:00").time_ms == int(when.timestamp() * 1000)
    assert parse_bound("2026-11-30T02:00:00+01:00").time_ms == int(when.timestamp() * 1000)
    with pytest.raises(ValueError, match="offset"):
        parse_bound("yesterday")


def test_cli_reports_a_bad_jsonl_line_clearly(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "bad.jsonl").write_text('{"nope": 1}\n')
    assert main(["replay-rebuild", "--jsonl", str(tmp_path / "bad.jsonl"), "--out", str(tmp_path / "o")]) == 2
    assert "bad.jsonl:1" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"bad\.jsonl:1"):
        load_events_jsonl(tmp_path / "bad.jsonl")
