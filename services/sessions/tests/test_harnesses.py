"""Real harness CLIs (installed by deploy/harnesses/install.sh) run headless in the sandbox against the real gateway.

The model behind the gateway is the scripted fake engine of the gateway tests (a real HTTP server), so these run in
seconds and each harness gets a well-formed reply; ``tests/e2e`` runs the same harnesses over Kafka with the real
CPU engine. A harness that is not installed fails the test with the install hint (never a skip).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from contracts import SessionState
from sessions.node import SessionNode
from sessions.settings import SessionSettings

from .conftest import EventLog, GatewayUnderTest, LocalTaskSet, request

pytestmark = pytest.mark.slow


@pytest.fixture
async def node(settings: SessionSettings, gateway: GatewayUnderTest) -> AsyncIterator[tuple[SessionNode, EventLog]]:
    log = EventLog()
    node = SessionNode(settings, kafka=None, gateway=gateway.link)  # type: ignore[arg-type]
    node.start_local(log)
    yield node, log
    await node.shutdown()


HARNESSES = ["pi", "codex", "claude-code", "qwen-code", "gemini-cli", "opencode", "mini-swe-agent"]


@pytest.mark.parametrize("harness", HARNESSES)
async def test_harness_session_reaches_done_with_calls_recorded(
    node: tuple[SessionNode, EventLog], taskset: LocalTaskSet, gateway: GatewayUnderTest, harness: str
) -> None:
    n, log = node
    req = request(taskset, harness=harness, agent_timeout_s=120, session_timeout_s=180)
    assert await n.submit(req)
    finished = await n.wait_finished(req.session_id, 200)
    detail = f"{finished.reason}\nstdout: {finished.stdout_tail[-2000:]}\nstderr: {finished.stderr_tail[-3000:]}"
    assert finished.status is SessionState.DONE, detail
    assert log.path(req.session_id) == ["REQUESTED", "PREPARING", "READY", "RUNNING", "FINISHING", "DONE"]
    calls = [e for e in gateway.sink.events if getattr(e, "session_id", None) == req.session_id]
    assert calls and finished.calls >= len(calls), detail
    assert finished.diff == "" or finished.diff.startswith("diff --git")
