"""End to end over real Kafka: SessionRequested -> gateway node -> real harness CLI in the sandbox -> real gateway ->
real CPU inference engine (random tiny model) -> ModelCallRecorded + SessionFinished on the broker.

The engine runs as its own process (``python -m inference``, the tiny dev checkpoint built on first start), exactly
as deployed; the gateway and the session node share this test's process, as on a gateway node. With random weights
the harness gets gibberish and usually changes nothing: an empty diff is expected; what is checked is the lifecycle,
the calls recorded under the session id, and the result on the finished topic.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from contracts import (
    MODEL_CALLS,
    SESSIONS_CANCEL,
    SESSIONS_FINISHED,
    SESSIONS_REQUESTED,
    SESSIONS_STATE,
    ModelCallRecorded,
    SamplingPolicy,
    SessionFinished,
    SessionRequested,
    SessionState,
    SessionStateChanged,
    Topic,
)
from eventbus import Consumer, KafkaSettings, Producer
from gateway import GatewaySettings, create_app
from services.gateway.tests._fakes import free_port, serve
from sessions.gateway_node import RegistryGateway
from sessions.node import NodeTopics, SessionNode
from sessions.settings import SessionSettings

from .conftest import request
from .engine_process import cpu_engine_process

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TASK = "floe__calx-7"


@pytest.fixture(scope="module")
def cpu_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("engine")
    env = {
        "FLOE_INFERENCE_MODEL_DIR": str(root / "model"),
        "FLOE_INFERENCE_CONSUME_WEIGHTS": "false",
        "FLOE_INFERENCE_THREADS": "1",
        "FLOE_INFERENCE_SEED": "7",
    }
    with cpu_engine_process(env, root / "engine.log") as url:
        yield url


class Seen:
    def __init__(self) -> None:
        self.states: dict[str, list[str]] = {}
        self.finished: dict[str, SessionFinished] = {}
        self.calls: dict[str, list[ModelCallRecorded]] = {}

    async def pump(self, consumer: Consumer[Any]) -> None:
        async for msg in consumer:
            e = msg.event
            if isinstance(e, SessionStateChanged):
                self.states.setdefault(e.session_id, []).append(e.state.value)
            elif isinstance(e, SessionFinished):
                self.finished[e.session_id] = e
            elif isinstance(e, ModelCallRecorded):
                self.calls.setdefault(e.session_id, []).append(e)


@pytest.fixture
async def stack(
    settings: SessionSettings,
    kafka_settings: KafkaSettings,
    topic_factory: Any,
    consumer_group: str,
    cpu_engine: str,
) -> AsyncIterator[tuple[NodeTopics, Producer, Seen]]:
    calls_topic = topic_factory(MODEL_CALLS)
    topics = NodeTopics(
        requested=topic_factory(SESSIONS_REQUESTED),
        cancel=topic_factory(SESSIONS_CANCEL),
        state=topic_factory(SESSIONS_STATE),
        finished=topic_factory(SESSIONS_FINISHED),
    )
    port = free_port()
    gw_settings = GatewaySettings(
        engine_urls=[cpu_engine], public_url=f"http://127.0.0.1:{port}", model_calls_topic=calls_topic.name
    )
    app = create_app(gw_settings, kafka=kafka_settings)
    seen = Seen()
    observed: list[Topic[Any]] = [topics.state, topics.finished, calls_topic]
    with serve(app, port) as url:
        node = SessionNode(
            settings, kafka_settings, RegistryGateway(app.state.registry, url), topics=topics, group_id=consumer_group
        )
        async with (
            Producer(kafka_settings) as producer,
            Consumer[Any](kafka_settings, observed, group_id=consumer_group + "-obs") as consumer,
        ):
            node_task = asyncio.create_task(node.run())
            pump = asyncio.create_task(seen.pump(consumer))
            await asyncio.wait_for(node.started.wait(), 30)
            try:
                yield topics, producer, seen
            finally:
                node_task.cancel()
                pump.cancel()
                await asyncio.gather(node_task, pump, return_exceptions=True)


async def _run_to_end(
    topics: NodeTopics, producer: Producer, seen: Seen, req: SessionRequested, timeout_s: float
) -> tuple[SessionFinished, str]:
    """Request the session, wait for its SessionFinished; return it with a failure message of its reason and output."""
    await producer.send(topics.requested, req)
    deadline = time.monotonic() + timeout_s
    while req.session_id not in seen.finished:
        assert time.monotonic() < deadline, f"no result; states so far {seen.states.get(req.session_id)}"
        await asyncio.sleep(0.2)
    finished = seen.finished[req.session_id]
    detail = f"{finished.reason}\nstdout: {finished.stdout_tail[-1500:]}\nstderr: {finished.stderr_tail[-2500:]}"
    return finished, detail


@pytest.mark.parametrize("harness", ["pi", "codex", "claude-code", "qwen-code"])
async def test_harness_on_bundled_task_over_kafka_with_cpu_engine(
    stack: tuple[NodeTopics, Producer, Seen], taskset: Any, harness: str
) -> None:
    topics, producer, seen = stack
    req = request(
        taskset,
        harness=harness,
        task_id=TASK,
        task_source="bundled",
        sampling=SamplingPolicy(temperature=1.0, max_tokens=48, seed=1),
        agent_timeout_s=240,
        session_timeout_s=300,
    )
    finished, detail = await _run_to_end(topics, producer, seen, req, timeout_s=320)
    assert finished.status is SessionState.DONE, detail
    # Calls and results travel on different topics: give the call records a moment to arrive.
    deadline = time.monotonic() + 30
    while len(seen.calls.get(req.session_id, [])) < finished.turns and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert seen.states[req.session_id] == ["REQUESTED", "PREPARING", "READY", "RUNNING", "FINISHING", "DONE"]
    calls = seen.calls[req.session_id]
    assert [c.call_index for c in calls] == list(range(len(calls)))
    assert all(len(c.completion_token_ids) <= 48 for c in calls)
    assert finished.calls >= len(calls) >= 1
    assert finished.diff == "" or finished.diff.startswith("diff --git")
    assert Path(finished.task_id).name == TASK


@pytest.mark.parametrize("harness", ["toy", "toy-stdlib"])
async def test_toy_agent_both_clients_answer_through_the_gateway(
    stack: tuple[NodeTopics, Producer, Seen], taskset: Any, harness: str
) -> None:
    """The demo's toy agent, with the official openai SDK (``toy``) and with its standard-library client
    (``toy-stdlib``): one recorded call each, and the reply lands in answer.txt, which is the session's diff."""
    from floe_tasks import TaskSet

    topics, producer, seen = stack
    task_id = TaskSet.from_source("toy").ids()[0]
    req = request(
        taskset,
        harness=harness,
        task_id=task_id,
        task_source="toy",
        sampling=SamplingPolicy(temperature=1.0, max_tokens=8, seed=1),
        agent_timeout_s=120,
        session_timeout_s=180,
    )
    finished, detail = await _run_to_end(topics, producer, seen, req, timeout_s=200)
    assert finished.status is SessionState.DONE and finished.exit_code == 0, detail
    assert "answer: " in finished.stdout_tail, detail
    deadline = time.monotonic() + 30
    while not seen.calls.get(req.session_id) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    (call,) = seen.calls[req.session_id]
    assert 1 <= len(call.completion_token_ids) <= 8 and finished.calls == 1
    assert "answer.txt" in finished.diff, finished.diff
