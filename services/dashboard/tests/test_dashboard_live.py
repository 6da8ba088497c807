"""The dashboard over a real broker, a real server socket and a real browser (headless Chromium)."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from contracts import (
    MODEL_CALLS,
    REWARDS,
    SESSIONS_FINISHED,
    SESSIONS_REQUESTED,
    SESSIONS_STATE,
    TRAJECTORY_BATCHES,
    WEIGHTS,
    ModelCallRecorded,
    Outcome,
    Protocol,
    RewardPublished,
    SessionKind,
    SessionRequested,
    SessionState,
    SessionStateChanged,
    TokenizationMode,
    Topic,
    TrajectoryBatch,
    TrajectoryRow,
    WeightsPublished,
    to_ipc,
)
from dashboard.app import create_app
from dashboard.settings import DashboardSettings
from eventbus import KafkaSettings, Producer

pytestmark = pytest.mark.integration

ARTIFACTS = Path(__file__).resolve().parents[3] / ".floe" / "test-artifacts"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())  # type: ignore[no-any-return]


def _row(sid: str, step_reward: float) -> TrajectoryRow:
    return TrajectoryRow(
        session_id=sid,
        group_id="g",
        task_id="t",
        harness="toy",
        builder="prefix_merging",
        trace_index=0,
        num_traces=1,
        prompt_len=2,
        tokens=(1, 2, 3),
        loss_mask=(0, 0, 1),
        logprobs=(0.0, 0.0, -0.3),
        weight_versions=(-1, -1, 0),
        reward=step_reward,
        advantage=0.0,
        session_weight=1.0,
        status="DONE",
    )


@pytest.fixture
def topics(topic_factory: Callable[[Topic[Any]], Topic[Any]]) -> tuple[Topic[Any], ...]:
    return tuple(
        topic_factory(t)
        for t in (
            SESSIONS_STATE,
            SESSIONS_FINISHED,
            MODEL_CALLS,
            REWARDS,
            TRAJECTORY_BATCHES,
            WEIGHTS,
            SESSIONS_REQUESTED,
        )
    )


# Either client reads the same run: the wire contract, not the library, is what the services share.
@pytest.fixture(params=["aiokafka", "confluent"])
def server(
    request: pytest.FixtureRequest, kafka_settings: KafkaSettings, topics: tuple[Topic[Any], ...]
) -> Iterator[str]:
    port = _free_port()
    app = create_app(DashboardSettings(port=port, kafka_client=request.param), kafka_settings, topics)
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not srv.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert srv.started, "dashboard server did not start"
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(timeout=10)


async def _publish(kafka: KafkaSettings, topics: tuple[Topic[Any], ...]) -> None:
    state_t, _, calls_t, rewards_t, batches_t, weights_t, requested_t = topics
    async with Producer(kafka) as producer:
        # Two eval rounds of two sessions each: solved 1 of 2, then 2 of 2.
        for rnd, solved in [(0, [True, False]), (1, [True, True])]:
            for i, ok in enumerate(solved):
                sid = f"eval-{rnd}-{i}"
                meta = {"run": "heldout", "eval_round": str(rnd), "eval_at_version": str(2 * rnd)}
                await producer.send(
                    requested_t,
                    SessionRequested(
                        session_id=sid,
                        group_id=f"eval-{rnd}",
                        task_id="e",
                        harness="toy",
                        kind=SessionKind.EVAL,
                        metadata=meta,
                    ),
                )
                await producer.send(
                    rewards_t,
                    RewardPublished(
                        session_id=sid,
                        group_id=f"eval-{rnd}",
                        task_id="e",
                        reward=float(ok),
                        outcome=Outcome.RESOLVED if ok else Outcome.UNRESOLVED,
                        resolved=ok,
                    ),
                )
        for i in range(3):
            sid = f"s{i}"
            await producer.send(
                state_t,
                SessionStateChanged(
                    session_id=sid,
                    group_id="g",
                    node_id="n",
                    state=SessionState.PREPARING,
                    previous=SessionState.REQUESTED,
                    seq=0,
                ),
            )
            await producer.send(
                calls_t,
                ModelCallRecorded(
                    session_id=sid,
                    call_index=0,
                    call_id=f"{sid}-0",
                    protocol=Protocol.OPENAI_CHAT,
                    tokenization=TokenizationMode.EXACT,
                    model="m",
                    weight_version=0,
                    prompt_token_ids=[1, 2],
                    prompt_len=2,
                    completion_token_ids=[3],
                    completion_logprobs=[-0.3],
                    finish_reason="stop",
                ),
            )
        for step, reward in enumerate([0.1, 0.4, 0.8]):
            ipc = to_ipc([_row(f"s{step}", reward)])
            await producer.send(
                batches_t,
                TrajectoryBatch(
                    batch_id=f"b{step}",
                    step=step,
                    num_rows=1,
                    num_groups=1,
                    num_sessions=1,
                    builder="prefix_merging",
                    min_weight_version=0,
                    max_weight_version=0,
                    size_bytes=len(ipc),
                    arrow_ipc=ipc,
                    metrics={"groups.dropped_zero_signal": 1.0, "groups.dropped_zero_signal_total": step + 1.0},
                ),
            )
            await producer.send(
                weights_t,
                WeightsPublished(
                    version=step + 1,
                    uri=f"file:///ckpt/{step}",
                    step=step,
                    metrics={"loss": 1.0 / (step + 1), "tokens_per_s": 50.0},
                ),
            )


def test_dashboard_shows_a_live_run(server: str, kafka_settings: KafkaSettings, topics: tuple[Topic[Any], ...]) -> None:
    asyncio.run(_publish(kafka_settings, topics))

    def settled(s: dict[str, Any]) -> bool:
        # Every topic is consumed on its own: wait until each one's last event is in, not just the batches'.
        scored = [r["scored"] for r in s["eval_rounds"]]
        return len(s["reward_per_step"]) == 3 and s["weight_version"] == 3 and scored == [2, 2]

    deadline = time.monotonic() + 30
    state = _get(f"{server}/api/state")
    while not settled(state) and time.monotonic() < deadline:
        time.sleep(0.2)
        state = _get(f"{server}/api/state")
    assert [round(p["reward_mean"], 3) for p in state["reward_per_step"]] == [0.1, 0.4, 0.8]
    assert state["weight_version"] == 3
    assert state["sessions_by_state"]["PREPARING"] == 3
    assert state["harness"]["toy"]["trainable_fraction"] == pytest.approx(1 / 3)
    assert [(r["round"], r["solved_fraction"]) for r in state["eval_rounds"]] == [(0, 0.5), (1, 1.0)]
    assert state["selection"]["groups_dropped_zero_signal"] == 3

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "headless Chromium is required (make test-deps installs Debian's chromium)"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "dashboard.png"
    shot.unlink(missing_ok=True)
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={ARTIFACTS / 'chromium-profile'}",
        "--window-size=1400,1000",
    ]
    # --dump-dom after the page's own polling ran: the DOM then holds the rendered numbers and plot point counts.
    dom = subprocess.run(
        [chromium, *flags, "--virtual-time-budget=4000", "--dump-dom", server],
        capture_output=True,
        text=True,
        timeout=90,
        check=True,
    ).stdout
    assert 'data-loaded="1"' in dom, "the page never loaded its state"
    assert re.search(r'<canvas id="reward"[^>]*data-points="3"', dom), "the reward plot did not render the 3 steps"
    assert 'id="version">3<' in dom
    assert re.search(r'<canvas id="eval"[^>]*data-points="2"', dom), "the eval plot did not render the 2 rounds"
    assert 'id="dropped">3<' in dom and "<td>heldout</td><td>1</td><td>2</td><td>2 / 2</td>" in dom
    subprocess.run(
        [chromium, *flags, "--virtual-time-budget=4000", f"--screenshot={shot}", server],
        capture_output=True,
        timeout=90,
        check=True,
    )
    assert shot.exists() and shot.stat().st_size > 10_000
