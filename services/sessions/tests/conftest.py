"""Fixtures of the session-runner tests.

- ``work_root``: a fresh directory the sandbox uid can traverse (pytest's own tmp dirs are mode 0700); at teardown
  it must hold no session or workspace directory: every test checks cleanup for free.
- ``taskset``: a real ``floe_tasks`` JSONL task set with a real git bundle (text + binary files), built per test
  session, so workspaces are materialized exactly as for bundled tasks.
- ``gateway``: the real gateway app (uvicorn on a loopback port) with the scripted fake engine of the gateway tests;
  the runner talks to its in-process registry, harnesses to its HTTP port through the bridge.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from contracts import SessionFinished, SessionRequested, SessionStateChanged
from gateway import GatewaySettings, create_app
from services.gateway.tests import _fakes
from services.gateway.tests._fakes import FakeEngine, MemorySink, free_port, serve
from sessions.gateway_node import RegistryGateway
from sessions.settings import SessionSettings

PRESETS_DIR = Path(__file__).resolve().parents[1] / "presets"
BINARY = bytes(range(256)) * 4


def _git(cwd: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True, env=env).stdout


@dataclass(frozen=True)
class LocalTaskSet:
    jsonl: Path
    base_commit: str


@pytest.fixture(scope="session")
def taskset(tmp_path_factory: pytest.TempPathFactory) -> LocalTaskSet:
    root = tmp_path_factory.mktemp("taskset")
    repo = root / "src"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    (repo / "README.md").write_text("# demo\n")
    (repo / "app.py").write_text("def add(a, b):\n    return a - b\n")
    (repo / "data.bin").write_bytes(BINARY)
    (repo / "old.txt").write_text("to be deleted\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "base")
    base = _git(repo, "rev-parse", "HEAD").strip()
    # A later commit (the "fix") must never reach the workspace: the bundle holds only the base.
    repos = root / "set" / "repos"
    repos.mkdir(parents=True)
    _git(repo, "bundle", "create", str(repos / "demo__repo.bundle"), "main")
    rows: list[dict[str, Any]] = [
        {"instance_id": "demo-1", "repo": "demo/repo", "base_commit": base, "problem_statement": "Fix add()."},
        {
            "instance_id": "demo-prep",
            "repo": "demo/repo",
            "base_commit": base,
            "problem_statement": "Prepared task.",
            # Prepare steps leave the tracked tree clean; our own .floe/ is never part of the diff.
            "prepare": [
                "test -f README.md",
                "mkdir -p .floe && id -u > .floe/prepared-by",
                "mkdir -p build && echo artifact > build/out.txt && echo x > 'weird [name].log'",
            ],
        },
        {
            "instance_id": "demo-slowprep",
            "repo": "demo/repo",
            "base_commit": base,
            "problem_statement": "Slow.",
            "prepare": ["sleep 30"],
        },
        {
            "instance_id": "demo-badprep",
            "repo": "demo/repo",
            "base_commit": base,
            "problem_statement": "Broken.",
            "prepare": ["echo boom >&2; exit 3"],
        },
        {"instance_id": "demo-nobundle", "repo": "demo/missing", "base_commit": base, "problem_statement": "x"},
    ]
    jsonl = root / "set" / "tasks.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return LocalTaskSet(jsonl=jsonl, base_commit=base)


@pytest.fixture
def work_root() -> Iterator[Path]:
    root = Path("/tmp") / f"floe-sessions-test-{secrets.token_hex(6)}"
    root.mkdir(mode=0o711)
    os.chmod(root, 0o711)
    yield root
    leftovers = [p for sub in ("sessions", "ws") if (root / sub).is_dir() for p in (root / sub).iterdir()]
    shutil.rmtree(root, ignore_errors=True)
    assert not leftovers, f"session directories survived the test: {leftovers}"


@pytest.fixture
def settings(work_root: Path) -> SessionSettings:
    return SessionSettings(
        node_id="test-node",
        work_root=work_root,
        presets_dir=PRESETS_DIR,
        max_preparing=2,
        max_running=2,
        pool_lookahead=0,
        prepare_network=False,
        kill_grace_s=0.1,
    )


@dataclass
class GatewayUnderTest:
    url: str
    app: Any
    engine: FakeEngine
    sink: MemorySink
    link: RegistryGateway


@pytest.fixture(scope="module")
def fake_engine_url() -> Iterator[tuple[FakeEngine, str]]:
    # Real harness prompts are long (Qwen Code's system prompt alone is 37K characters) and the fake tokenizer is
    # character level: widen its context for these tests.
    saved, _fakes.MAX_MODEL_LEN = _fakes.MAX_MODEL_LEN, 400_000
    engine = FakeEngine()
    try:
        with serve(engine.app) as url:
            yield engine, url
    finally:
        _fakes.MAX_MODEL_LEN = saved


@pytest.fixture
def gateway(fake_engine_url: tuple[FakeEngine, str]) -> Iterator[GatewayUnderTest]:
    engine, engine_url = fake_engine_url
    sink = MemorySink()
    port = free_port()
    app = create_app(
        GatewaySettings(
            engine_urls=[engine_url], control_token=SecretStr("ctl"), public_url=f"http://127.0.0.1:{port}"
        ),
        sink=sink,
    )
    with serve(app, port) as url:
        yield GatewayUnderTest(url, app, engine, sink, RegistryGateway(app.state.registry, url))


class EventLog:
    """In-memory ``EventSink`` for runner unit tests (the Kafka tests use the real broker)."""

    def __init__(self) -> None:
        self.states: list[SessionStateChanged] = []
        self.results: list[SessionFinished] = []

    async def state(self, event: SessionStateChanged) -> None:
        self.states.append(event)

    async def finished(self, event: SessionFinished) -> None:
        self.results.append(event)

    def path(self, session_id: str) -> list[str]:
        return [e.state.value for e in self.states if e.session_id == session_id]


def request(taskset: LocalTaskSet, harness: str = "command", task_id: str = "demo-1", **kw: Any) -> SessionRequested:
    fields: dict[str, Any] = {
        "session_id": "s-" + secrets.token_hex(6),
        "group_id": "g-test",
        "task_id": task_id,
        "task_source": str(taskset.jsonl),
        "harness": harness,
        "agent_timeout_s": 60.0,
        "session_timeout_s": 120.0,
    }
    fields.update(kw)
    return SessionRequested(**fields)


def sandbox_processes(marker: str) -> list[int]:
    """Host pids whose command line contains ``marker`` (a leak check)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline and int(entry.name) != os.getpid():
            pids.append(int(entry.name))
    return pids
