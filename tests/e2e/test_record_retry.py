"""A record the broker stored after the gateway gave up on it: the call asked again replaces it, end to end.

Real parts: a broker of the test's own (it is stopped with SIGSTOP, so the shared one is left alone), floe's CPU
engine, the gateway producing to that broker, and the rollout's reconstruction reading the topic back. The broker
stalls for longer than the gateway's record deadline, so the call fails (503) while its record sits in the broker's
socket; once the broker runs again it stores that record anyway. The harness asks again and is answered. Both
records of call 0 are on the topic; the rollout must train on the one the harness got.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from contracts import MODEL_CALLS, ModelCallRecorded, Topic
from eventbus import Consumer, KafkaSettings, ensure_topics
from eventbus.broker import LocalBroker, free_ports
from eventbus.serving import serve_in_thread
from gateway import GatewaySettings, create_app
from rollout.calls import decode_calls

pytestmark = pytest.mark.integration

CONTROL = "control-secret"
RECORD_TIMEOUT_S = 2.0


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[tuple[LocalBroker, KafkaSettings]]:
    local = LocalBroker.at(tmp_path / "kafka")
    address = local.start(*free_ports(2), owner_pid=os.getpid())
    try:
        yield local, KafkaSettings(bootstrap_servers=address)
    finally:
        pid = local.pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)  # never leave a stopped JVM behind a failed test
        local.stop(timeout_s=10)


async def _records(kafka: KafkaSettings, topic: Topic[Any], n: int) -> list[ModelCallRecorded]:
    out: list[ModelCallRecorded] = []

    async def collect() -> None:
        async with Consumer(kafka, [topic], group_id="record-retry") as consumer:
            async for msg in consumer:
                out.append(msg.event)
                if len(out) >= n:
                    return

    await asyncio.wait_for(collect(), 60)
    return out


def test_a_record_stored_after_its_call_failed_is_replaced_by_the_call_asked_again(
    broker: tuple[LocalBroker, KafkaSettings], tmp_path: Path
) -> None:
    from inference import create_app as create_engine
    from inference.settings import InferenceSettings

    local, kafka = broker
    topic = MODEL_CALLS.with_name("floe.model-calls.record-retry")
    asyncio.run(ensure_topics(kafka, [topic]))
    engine = create_engine(InferenceSettings(model_dir=tmp_path / "model", consume_weights=False, threads=1))
    with serve_in_thread(engine) as engine_url:
        port = free_ports(1)[0]
        settings = GatewaySettings(
            engine_urls=[engine_url],
            control_token=SecretStr(CONTROL),
            public_url=f"http://127.0.0.1:{port}",
            model_calls_topic=topic.name,
            record_timeout_s=RECORD_TIMEOUT_S,
            default_max_tokens=8,
        )
        with serve_in_thread(create_app(settings, kafka=kafka), port) as gw:

            def session(sid: str) -> dict[str, str]:
                r = httpx.post(
                    gw + "/admin/sessions",
                    json={"session_id": sid, "tokenization": "exact", "model": "policy"},
                    headers={"authorization": f"Bearer {CONTROL}"},
                )
                r.raise_for_status()
                return {"authorization": f"Bearer {r.json()['token']}"}

            def chat(harness: dict[str, str], messages: list[dict[str, str]], seed: int) -> httpx.Response:
                body = {"model": "policy", "messages": messages, "temperature": 1.0, "seed": seed}
                return httpx.post(gw + "/v1/chat/completions", json=body, headers=harness, timeout=60)

            ask = [{"role": "user", "content": "fix the bug"}]
            # The producer has its broker connection and idempotence id before the stall (another session, so the
            # first call of the session under test is the one that fails).
            assert chat(session("s-warm"), ask, 0).status_code == 200
            harness = session("s-retry")
            pid = local.pid()
            assert pid is not None
            os.kill(pid, signal.SIGSTOP)
            try:
                failed = chat(harness, ask, 1)
            finally:
                os.kill(pid, signal.SIGCONT)
            assert failed.status_code == 503, failed.text
            answered = chat(harness, ask, 2)  # the harness asks again (another sample: the answers differ)
            assert answered.status_code == 200, answered.text
            reply = answered.json()["choices"][0]["message"]["content"] or ""
            assert chat(harness, [*ask, {"role": "assistant", "content": reply}, *ask], 3).status_code == 200

    records = [r for r in asyncio.run(_records(kafka, topic, 4)) if r.session_id == "s-retry"]
    stale, again, second = records  # one partition key (the session's group): in the order they were produced
    assert stale.completion_token_ids != again.completion_token_ids
    assert stale.call_index == again.call_index == 0 and second.call_index == 1
    assert again.supersedes_call_ids == [stale.call_id] and second.supersedes_call_ids == []
    decoded = decode_calls(records)
    assert [d.call_id for d in decoded] == [again.call_id, second.call_id]
    assert decoded[0].completion == tuple(again.completion_token_ids)
    # The second call's prompt is delta-encoded against the answer the harness got, and decoded against that one.
    assert second.prefix_call_index == 0 and second.prefix_len > len(again.prompt_token_ids)
    expected = (tuple(again.prompt_token_ids) + tuple(again.completion_token_ids))[: second.prefix_len]
    assert decoded[1].prompt == expected + tuple(second.prompt_token_ids)
