"""Whole sessions through the runner (no Kafka: an in-memory event log; the Kafka wiring is test_node_kafka.py).

The harness is the generic ``command`` preset with scripted shell lines, talking to the real gateway app over the
bridge. Each test ends with the ``work_root`` fixture's check that no session or workspace directory survived.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from contracts import SessionFinished, SessionState
from sessions.node import SessionNode
from sessions.settings import SessionSettings

from .conftest import EventLog, GatewayUnderTest, LocalTaskSet, request, sandbox_processes

HAPPY = ["REQUESTED", "PREPARING", "READY", "RUNNING", "FINISHING", "DONE"]


@pytest.fixture
async def node(settings: SessionSettings, gateway: GatewayUnderTest) -> AsyncIterator[tuple[SessionNode, EventLog]]:
    log = EventLog()
    node = SessionNode(settings, kafka=None, gateway=gateway.link)  # type: ignore[arg-type]
    node.start_local(log)
    yield node, log
    await node.shutdown()


async def run(node: SessionNode, req: object, timeout: float = 60.0) -> SessionFinished:
    assert await node.submit(req)  # type: ignore[arg-type]
    return await node.wait_finished(req.session_id, timeout)  # type: ignore[attr-defined]


async def test_command_session_collects_exact_diff_and_records_calls(
    node: tuple[SessionNode, EventLog], taskset: LocalTaskSet, gateway: GatewayUnderTest
) -> None:
    n, log = node
    # The scripted "agent": calls the model through the bridge with its session token, writes the fix and a
    # binary file, deletes a file, and leaves harness state that must not reach the diff.
    script = (
        "set -e; python3 - <<'PY'\n"
        "import json, os, urllib.request\n"
        "req = urllib.request.Request(os.environ['OPENAI_BASE_URL'] + '/chat/completions',\n"
        "    data=json.dumps({'model': os.environ['FLOE_MODEL'],\n"
        "                     'messages': [{'role': 'user', 'content': 'hi'}]}).encode(),\n"
        "    headers={'Authorization': 'Bearer ' + os.environ['OPENAI_API_KEY'], 'Content-Type': 'application/json'})\n"
        "reply = json.load(urllib.request.urlopen(req, timeout=30))\n"
        "open('reply.txt', 'w').write(reply['choices'][0]['message']['content'] + '\\n')\n"
        "PY\n"
        "sed -i 's/a - b/a + b/' app.py; printf '\\000\\001\\002' > blob.bin; rm old.txt; echo agent-says-done"
    )
    req = request(taskset, metadata={"command": script})
    finished = await run(n, req)
    assert finished.status is SessionState.DONE, finished.reason
    assert log.path(req.session_id) == HAPPY
    assert [e.seq for e in log.states] == list(range(6))
    assert finished.exit_code == 0 and "agent-says-done" in finished.stdout_tail
    assert "-    return a - b\n+    return a + b" in finished.diff
    assert "reply.txt" in finished.diff and "Hello! You said: hi" in finished.diff
    assert "deleted file mode" in finished.diff and "GIT binary patch" in finished.diff
    assert finished.calls == 1 and finished.turns == 1
    calls = [e for e in gateway.sink.events if getattr(e, "session_id", None) == req.session_id]
    assert len(calls) == 1 and calls[0].call_index == 0
    for key in ("prepare_ms", "ready_wait_ms", "start_latency_ms", "agent_ms", "diff_ms", "total_ms"):
        assert key in finished.timings_ms
    assert log.results == [finished]
    # The session's token is closed with it.
    assert gateway.app.state.registry.get(req.session_id).closed


async def test_harness_crash_is_failed_with_reason_and_diff(
    node: tuple[SessionNode, EventLog], taskset: LocalTaskSet
) -> None:
    n, log = node
    req = request(taskset, metadata={"command": "echo partial >> README.md; echo oops >&2; exit 7"})
    finished = await run(n, req)
    assert finished.status is SessionState.FAILED
    assert finished.reason == "harness command exited with code 7"
    assert finished.exit_code == 7 and "oops" in finished.stderr_tail and "+partial" in finished.diff
    assert log.path(req.session_id) == [*HAPPY[:5], "FAILED"]


async def test_harness_killed_by_signal_is_a_crash(node: tuple[SessionNode, EventLog], taskset: LocalTaskSet) -> None:
    n, _ = node
    finished = await run(n, request(taskset, metadata={"command": "echo x > x.txt; kill -SEGV $$"}))
    assert finished.status is SessionState.FAILED
    assert finished.reason == "harness command crashed (signal 11)" and "+x" in finished.diff


async def test_nonzero_exit_after_clean_calls_is_a_trainable_done(
    node: tuple[SessionNode, EventLog], taskset: LocalTaskSet
) -> None:
    n, _ = node
    call = (
        "python3 -c \"import json,os,urllib.request as u; u.urlopen(u.Request(os.environ['OPENAI_BASE_URL'] + "
        "'/chat/completions', json.dumps({'model': 'm', 'messages': [{'role': 'user', 'content': 'hi'}]}).encode(), "
        "{'Authorization': 'Bearer ' + os.environ['OPENAI_API_KEY'], 'Content-Type': 'application/json'})).read()\""
    )
    finished = await run(n, request(taskset, metadata={"command": f"{call} && exit 1"}))
    assert finished.status is SessionState.DONE and finished.exit_code == 1
    assert finished.reason == "harness command exited with code 1 after 1 clean call(s)"


async def test_refused_call_names_the_gateway_error_in_the_reason(
    node: tuple[SessionNode, EventLog], taskset: LocalTaskSet
) -> None:
    # A prompt longer than the engine's context (the fake engine's is 400k tokens, one per character): the gateway
    # answers context_length_exceeded without calling the engine, and the session says so.
    call = (
        "python3 -c \"import json,os,urllib.request as u; u.urlopen(u.Request(os.environ['OPENAI_BASE_URL'] + "
        "'/chat/completions', json.dumps({'model': 'm', 'messages': [{'role': 'user', 'content': 'x' * 400001}]})"
        ".encode(), {'Authorization': 'Bearer ' + os.environ['OPENAI_API_KEY'], "
        "'Content-Type': 'application/json'})).read()\""
    )
    n, _ = node
    finished = await run(n, request(taskset, metadata={"command": call}))
    assert finished.status is SessionState.FAILED and finished.exit_code == 1 and finished.turns == 0
    assert finished.reason is not None
    assert finished.reason.startswith("harness command exited with code 1; the gateway refused 1 call(s), the last: ")
    assert "context_overflow: prompt is too long" in finished.reason and "maximum context length" in finished.reason
    assert "HTTP Error 400" in finished.stderr_tail
    assert finished.calls == 0 and finished.timings_ms["failed_calls"] == 1  # no record to wait for
    assert finished.timings_ms["unrecorded:context_overflow"] == 1  # and why it has none


async def test_calls_counts_only_recorded_calls_when_one_failed_and_the_harness_retried(
    node: tuple[SessionNode, EventLog], taskset: LocalTaskSet
) -> None:
    # An SDK that retries a failed call makes two calls for one answer: only the served one has a record on the
    # calls topic, and SessionFinished.calls is what the rollout waits for (it stalled for its grace period when
    # this counted the failed call too).
    call = (
        'python3 -c "import json,os,urllib.request as u, urllib.error as e\n'
        "def ask(text):\n"
        "    body = json.dumps({'model': 'm', 'messages': [{'role': 'user', 'content': text}]}).encode()\n"
        "    h = {'Authorization': 'Bearer ' + os.environ['OPENAI_API_KEY'], 'Content-Type': 'application/json'}\n"
        "    return u.urlopen(u.Request(os.environ['OPENAI_BASE_URL'] + '/chat/completions', body, h)).read()\n"
        "try:\n"
        "    ask('x' * 400001)\n"
        "except e.HTTPError:\n"
        "    ask('hi')\n\""
    )
    n, _ = node
    finished = await run(n, request(taskset, metadata={"command": call}))
    assert finished.status is SessionState.DONE and finished.exit_code == 0, finished.stderr_tail
    assert finished.calls == 1 and finished.turns == 1 and finished.timings_ms["failed_calls"] == 1
    assert [k for k in finished.timings_ms if k.startswith("unrecorded:")] == ["unrecorded:context_overflow"]


async def test_agent_timeout_kills_tree_and_keeps_diff(
    node: tuple[SessionNode, EventLog], taskset: LocalTaskSet
) -> None:
    n, _ = node
    marker = f"floe-agent-{secrets.token_hex(4)}"
    cmd = f"echo wip > wip.txt; setsid python3 -c 'import time; time.sleep(600)' {marker} & sleep 600"
    req = request(taskset, metadata={"command": cmd}, agent_timeout_s=1.0)
    finished = await run(n, req)
    assert finished.status is SessionState.TIMEOUT and finished.agent_timed_out
    assert "agent time budget" in (finished.reason or "")
    assert "+wip" in finished.diff
    assert sandbox_processes(marker) == []


async def test_session_deadline_ends_any_stage(node: tuple[SessionNode, EventLog], taskset: LocalTaskSet) -> None:
    n, log = node
    req = request(taskset, task_id="demo-slowprep", session_timeout_s=1.0, metadata={"command": "true"})
    finished = await run(n, req)
    assert finished.status is SessionState.TIMEOUT and not finished.agent_timed_out
    assert "session deadline" in (finished.reason or "")
    assert log.path(req.session_id) == ["REQUESTED", "PREPARING", "TIMEOUT"]


@pytest.mark.parametrize("stage", ["PREPARING", "RUNNING"])
async def test_cancel_at_any_stage_cleans_up(
    node: tuple[SessionNode, EventLog], taskset: LocalTaskSet, stage: str
) -> None:
    n, log = node
    marker = f"floe-cancel-{secrets.token_hex(4)}"
    task_id = "demo-slowprep" if stage == "PREPARING" else "demo-1"
    req = request(taskset, task_id=task_id, metadata={"command": f"python3 -c 'import time; time.sleep(600)' {marker}"})
    assert await n.submit(req)
    for _ in range(500):
        if log.path(req.session_id)[-1] == stage and (stage != "RUNNING" or sandbox_processes(marker)):
            break
        await asyncio.sleep(0.02)
    assert log.path(req.session_id)[-1] == stage
    assert n.cancel(req.session_id, "straggler cut-off")
    finished = await n.wait_finished(req.session_id, 30)
    assert finished.status is SessionState.CANCELLED and finished.reason == "straggler cut-off"
    assert log.path(req.session_id)[-1] == "CANCELLED"
    assert sandbox_processes(marker) == []


async def test_cancel_before_request_and_duplicates(node: tuple[SessionNode, EventLog], taskset: LocalTaskSet) -> None:
    n, log = node
    req = request(taskset, metadata={"command": "true"})
    assert not n.cancel(req.session_id, "group done")
    assert await n.submit(req)
    finished = await n.wait_finished(req.session_id, 10)
    assert finished.status is SessionState.CANCELLED and log.path(req.session_id) == ["REQUESTED", "CANCELLED"]
    # A redelivered request (same session id) never starts a second session.
    assert not await n.submit(req)
    assert log.path(req.session_id) == ["REQUESTED", "CANCELLED"]


@pytest.mark.parametrize(
    ("harness", "task_id", "metadata", "match"),
    [
        ("nonesuch", "demo-1", {}, "unknown harness preset"),
        ("command", "demo-1", {}, "metadata"),
        ("command", "no-such-task", {"command": "true"}, "no task"),
        ("command", "demo-badprep", {"command": "true"}, "exited 3"),
    ],
)
async def test_bad_input_fails_with_reason(
    node: tuple[SessionNode, EventLog],
    taskset: LocalTaskSet,
    harness: str,
    task_id: str,
    metadata: dict[str, str],
    match: str,
) -> None:
    n, _ = node
    finished = await run(n, request(taskset, harness=harness, task_id=task_id, metadata=metadata))
    assert finished.status is SessionState.FAILED
    assert match in (finished.reason or "")


async def test_missing_harness_cli_fails_cleanly(
    work_root: Path, taskset: LocalTaskSet, gateway: GatewayUnderTest, tmp_path: Path
) -> None:
    presets = tmp_path / "presets"
    presets.mkdir()
    (presets / "ghost.toml").write_text(
        "name = 'ghost'\ncli = 'ghost-agent-cli'\nprotocol = 'openai_chat'\ncommand = ['ghost-agent-cli']\n"
    )
    settings = SessionSettings(work_root=work_root, presets_dir=presets)
    log = EventLog()
    node = SessionNode(settings, kafka=None, gateway=gateway.link)  # type: ignore[arg-type]
    node.start_local(log)
    try:
        finished = await run(node, request(taskset, harness="ghost"))
    finally:
        await node.shutdown()
    assert finished.status is SessionState.FAILED
    assert "'ghost-agent-cli'" in (finished.reason or "") and "install.sh" in (finished.reason or "")


async def test_flooding_and_escaping_harness_is_contained(
    node: tuple[SessionNode, EventLog], taskset: LocalTaskSet, work_root: Path
) -> None:
    n, _ = node
    cmd = (
        "head -c 20000000 /dev/zero | tr '\\0' 'x'; echo; "
        "echo evil > /etc/evil 2>/dev/null || echo etc-refused; "
        f"echo evil > {work_root}/evil 2>/dev/null || echo host-refused; "
        "ls /tmp/floe-sessions-test-* 2>/dev/null | head -1; echo end"
    )
    finished = await run(n, request(taskset, metadata={"command": cmd}))
    assert finished.status is SessionState.DONE, finished.reason
    assert finished.stdout_tail.endswith("etc-refused\nhost-refused\nend\n")
    assert len(finished.stdout_tail) <= 8192
    assert not (work_root / "evil").exists() and not Path("/etc/evil").exists()


async def test_concurrent_sessions_share_nothing(node: tuple[SessionNode, EventLog], taskset: LocalTaskSet) -> None:
    n, _ = node
    reqs = [
        request(taskset, metadata={"command": f"echo {i} > mine.txt; ls /home; cat /proc/1/cmdline | tr '\\0' ' '"})
        for i in range(4)
    ]
    for r in reqs:
        assert await n.submit(r)
    results = [await n.wait_finished(r.session_id, 60) for r in reqs]
    for i, f in enumerate(results):
        assert f.status is SessionState.DONE, f.reason
        assert f"+{i}\n" in f.diff and f.diff.count("mine.txt") >= 1
        assert f.stdout_tail.split()[0] == "agent"  # /home holds only this sandbox's HOME
    assert json.dumps([f.diff for f in results]).count("mine.txt") >= 4


@pytest.fixture
async def capped_node(
    settings: SessionSettings, gateway: GatewayUnderTest
) -> AsyncIterator[tuple[SessionNode, EventLog]]:
    from sandbox.cgroup import Cgroup, CgroupUnavailable

    # No skip: these tests exist to show the caps hold, so a machine without the controllers fails them and says why.
    try:
        Cgroup.create(memory_bytes=64 * 1024**2, pids=8).remove()
    except CgroupUnavailable as exc:
        pytest.fail(f"the session's cgroup limits are not available on this machine: {exc}")
    log = EventLog()
    capped = settings.model_copy(update={"memory_mb": 128, "pids": 48})
    node = SessionNode(capped, kafka=None, gateway=gateway.link)  # type: ignore[arg-type]
    node.start_local(log)
    yield node, log
    await node.shutdown()


async def test_a_memory_bomb_ends_its_own_session_and_names_the_limit(
    capped_node: tuple[SessionNode, EventLog], taskset: LocalTaskSet
) -> None:
    n, _ = capped_node
    hog = "exec python3 -c 'b = []\nwhile True: b.append(bytearray(16 << 20))'"
    finished = await run(n, request(taskset, metadata={"command": "echo x > x.txt; " + hog}))
    assert finished.status is SessionState.FAILED
    assert finished.reason == "harness command crashed (signal 9); the memory limit (cgroup, 128.0 MiB) fired"
    assert "+x" in finished.diff  # the workspace is still diffed
    # The node is unharmed: the next session runs normally.
    after = await run(n, request(taskset, metadata={"command": "echo fine"}))
    assert after.status is SessionState.DONE, after.reason


async def test_a_fork_bomb_ends_its_own_session_and_names_the_limit(
    capped_node: tuple[SessionNode, EventLog], taskset: LocalTaskSet
) -> None:
    n, _ = capped_node
    bomb = (
        "python3 - <<'PY'\n"
        "import os, sys, time\n"
        "try:\n"
        "    while True:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(2)\n"
        "            os._exit(0)\n"
        "except OSError:\n"
        "    sys.exit(3)\n"
        "PY"
    )
    finished = await run(n, request(taskset, metadata={"command": bomb}))
    assert finished.status is SessionState.FAILED
    assert finished.reason == "harness command exited with code 3; the process-count limit (cgroup, 48) fired"
    after = await run(n, request(taskset, metadata={"command": "echo fine"}))
    assert after.status is SessionState.DONE, after.reason
