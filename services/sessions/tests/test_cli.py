"""``floe session run`` end to end: its own in-process gateway in front of an engine (the scripted fake engine, a
real HTTP server), one session, the transitions, diff and recorded calls printed."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import pytest

from sessions.cli import session_main

from .conftest import LocalTaskSet


def test_presets_listing() -> None:
    out = io.StringIO()
    assert session_main(["presets"], out=out) == 0
    listed = {line.split()[0] for line in out.getvalue().splitlines()}
    assert {"pi", "codex", "claude-code", "qwen-code", "command"} <= listed


async def test_session_run_prints_transitions_diff_and_calls(
    taskset: LocalTaskSet, fake_engine_url: tuple[object, str], work_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, engine_url = fake_engine_url
    monkeypatch.setenv("FLOE_GATEWAY_SESSIONS_WORK_ROOT", str(work_root))
    script = (
        "python3 -c \"import json,os,urllib.request as u; u.urlopen(u.Request(os.environ['OPENAI_BASE_URL'] + "
        "'/chat/completions', json.dumps({'model': 'm', 'messages': [{'role': 'user', 'content': 'hi'}]}).encode(), "
        "{'Authorization': 'Bearer ' + os.environ['OPENAI_API_KEY'], 'Content-Type': 'application/json'})).read()\""
        " && echo fixed >> README.md"
    )
    out = io.StringIO()
    argv = [
        "run",
        "--harness",
        "command",
        "--task",
        "demo-1",
        "--task-source",
        str(taskset.jsonl),
        "--engine-url",
        engine_url,
        "--command",
        script,
    ]
    # session_main owns its event loop (asyncio.run): run it in a thread, as the console script would.
    code = await asyncio.to_thread(session_main, argv, out)
    text = out.getvalue()
    assert code == 0, text
    for i, state in enumerate(["REQUESTED", "PREPARING", "READY", "RUNNING", "FINISHING", "DONE"]):
        assert f"[{i}] {state}" in text
    assert "+fixed" in text and "== recorded calls (1)" in text and "#0 openai_chat" in text


def test_session_run_without_an_engine_says_how_to_start_one(capsys: pytest.CaptureFixture[str]) -> None:
    # It used to run the harness anyway and end FAILED "harness pi exited with code 1" (the 503 in a stderr tail).
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]  # nothing listens once the socket is closed
    out = io.StringIO()
    argv = ["run", "--harness", "pi", "--task", "floe__pager-3", "--engine-url", f"http://127.0.0.1:{closed}"]
    assert session_main(argv, out=out) == 2
    err = capsys.readouterr().err
    assert f"no inference engine at http://127.0.0.1:{closed}" in err and "Connection refused" in err
    assert "floe serve inference" in err and "--engine-url" in err
    assert out.getvalue() == "", "no session was started"
