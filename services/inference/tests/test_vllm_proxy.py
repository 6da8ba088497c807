"""``--engine vllm``: weight versions on vLLM, through the proxy, with real checkpoints on a real broker.

The proxy runs in-process (uvicorn in a thread) in front of the session's one vLLM server (``vllm_server``), which
this module hands back on the real model's weights. Calls are greedy, with few tokens; the long one (LONG tokens) is
the request in flight while a reload starts. One test needs no vLLM: the proxy in front of a vLLM that is down.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from safetensors.torch import save_file

import contracts
from contracts import MODEL_CALLS, WEIGHTS, ModelCallRecorded, WeightsPublished
from eventbus import Consumer, KafkaSettings, Producer
from inference import InferenceSettings
from inference.testing import VllmServer, perturbed_checkpoint
from inference.vllm_proxy import create_vllm_app

from .conftest import free_port, running_app

MESSAGES = [{"role": "user", "content": "Write a short poem about the sea."}]
CONTROL = "proxy-test-control"
# Long enough to outlast publishing a version and the proxy's reaction to it with room to spare: one CI run saw
# 64 tokens on the CPU vLLM end before the gate closed (a producer started for the publish, ~0.6 s of that).
LONG = 384


def body(max_tokens: int) -> dict[str, Any]:
    return {
        "model": "policy",
        "messages": MESSAGES,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,  # every call runs its full length: the long one is surely in flight during the reload
        "logprobs": True,
        "return_token_ids": True,
    }


def logprobs_of(data: dict[str, Any]) -> list[float]:
    return [e["logprob"] for e in data["choices"][0]["logprobs"]["content"]]


async def post(client: httpx.AsyncClient, max_tokens: int = 8) -> dict[str, Any]:
    r = await client.post("/v1/chat/completions", json=body(max_tokens))
    assert r.status_code == 200, r.text
    data = r.json()
    assert int(r.headers["x-floe-weight-version"]) == data["weight_version"]
    return {"version": data["weight_version"], "logprobs": logprobs_of(data), "ids": data["choices"][0]["token_ids"]}


async def stream(client: httpx.AsyncClient, max_tokens: int, first_token: asyncio.Event) -> dict[str, Any]:
    payload = {**body(max_tokens), "stream": True, "stream_options": {"include_usage": True}}
    ids: list[int] = []
    lps: list[float] = []
    stamped: list[int] = []
    async with client.stream("POST", "/v1/chat/completions", json=payload) as r:
        assert r.status_code == 200, await r.aread()
        header = int(r.headers["x-floe-weight-version"])
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if "weight_version" in chunk:
                stamped.append(chunk["weight_version"])
            for choice in chunk["choices"]:
                ids += choice.get("token_ids") or []
                lps += [e["logprob"] for e in (choice.get("logprobs") or {}).get("content") or []]
            if ids:
                first_token.set()
    return {"header": header, "stamped": stamped, "ids": ids, "logprobs": lps, "finished_at": time.monotonic()}


async def health(client: httpx.AsyncClient) -> dict[str, Any]:
    return dict((await client.get("/health")).json())


async def until(client: httpx.AsyncClient, check: Callable[[dict[str, Any]], bool], what: str, s: float = 60) -> None:
    deadline = time.monotonic() + s
    while not check(await health(client)):
        assert time.monotonic() < deadline, f"{what}: not after {s} s; /health: {await health(client)}"
        await asyncio.sleep(0.02)


def incompatible_checkpoints(served: Path, out: Path) -> tuple[Path, Path]:
    """Another architecture (config.json), and the right one with most tensors missing (safetensors header)."""
    config = json.loads((served / "config.json").read_text())
    deeper = out / "deeper"
    deeper.mkdir()
    (deeper / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 2}))
    partial = out / "partial"
    partial.mkdir()
    shutil.copyfile(served / "config.json", partial / "config.json")
    save_file({"model.norm.weight": torch.ones(config["hidden_size"])}, str(partial / "model.safetensors"))
    return deeper, partial


async def publish(kafka: KafkaSettings, topic: contracts.Topic[Any], *events: WeightsPublished) -> None:
    async with Producer(kafka) as producer:
        for event in events:
            await producer.send(topic, event)


@pytest.mark.vllm
@pytest.mark.slow
def test_versions_on_vllm_follow_the_reloads(
    vllm_server: VllmServer,
    real_model_dir: Path,
    kafka_settings: KafkaSettings,
    topic_factory: Callable[..., contracts.Topic[Any]],
    serve: Callable[..., Any],
    tmp_path: Path,
) -> None:
    weights_topic = topic_factory(WEIGHTS)
    calls_topic = topic_factory(MODEL_CALLS)
    v1 = perturbed_checkpoint(real_model_dir, tmp_path / "v1", tensor="model.norm.weight", scale=1.5)
    deeper, partial = incompatible_checkpoints(real_model_dir, tmp_path)
    settings = InferenceSettings(
        engine="vllm",
        model_dir=real_model_dir,
        vllm_url=vllm_server.base_url,
        consume_weights=True,
        weights_topic=weights_topic.name,
        vllm_watch_s=0.5,
    )

    async def scenario(url: str) -> dict[str, Any]:
        async with httpx.AsyncClient(base_url=url, timeout=300) as client:
            await until(client, lambda h: h["weights_consumer"] == "ready", "weights consumer ready")
            before = await post(client)
            first = asyncio.Event()
            async with Producer(kafka_settings) as producer:  # started before the stream: the publish is quick
                in_flight = asyncio.create_task(stream(client, LONG, first))
                await asyncio.wait_for(first.wait(), 120)
                await producer.send(weights_topic, WeightsPublished(version=1, uri=str(v1), step=1))
            # The reload has started: the gate is closed while the long stream is still running.
            await until(client, lambda h: not h["admitting"], "gate closed for the reload")
            assert not in_flight.done(), "the long request ended before the reload started"
            after_task = asyncio.create_task(post(client))  # arrives while the gate is closed: waits in the proxy
            long = await in_flight
            after = await after_task
            reload_health = await health(client)
            async with httpx.AsyncClient(base_url=vllm_server.base_url, timeout=300) as direct:
                r = await direct.post("/v1/chat/completions", json=body(8))
                direct_logprobs = logprobs_of(r.json())
            await publish(
                kafka_settings,
                weights_topic,
                WeightsPublished(version=2, uri=str(deeper), step=2),
                WeightsPublished(version=3, uri=f"file://{partial}", step=3),
                WeightsPublished(version=1, uri=str(real_model_dir), step=1),  # stale: ignored
            )
            await until(client, lambda h: h["stats"]["refused"] == 2, "both incompatible checkpoints refused")
            refused = await post(client)
            final_health = await health(client)
        return {
            "before": before,
            "long": long,
            "after": after,
            "direct": direct_logprobs,
            "reload_health": reload_health,
            "refused": refused,
            "health": final_health,
        }

    async def restarted(url: str) -> dict[str, Any]:
        async with httpx.AsyncClient(base_url=url, timeout=300) as client:
            return await post(client)

    try:
        with serve(settings, kafka_settings, create_vllm_app) as url:
            out = asyncio.run(scenario(url))
            record = asyncio.run(gateway_call(url, kafka_settings, calls_topic))
        # This service restarted while vLLM kept running on version 1: it cannot trust what vLLM holds, so it
        # loads its start directory again before serving (and would then follow floe.weights, off here).
        again = settings.model_copy(update={"consume_weights": False})
        with serve(again, kafka_settings, create_vllm_app) as url:
            out["restarted"] = asyncio.run(restarted(url))
    finally:
        vllm_server.reload(real_model_dir)  # later tests of the session expect the real model's weights

    before, long, after = out["before"], out["long"], out["after"]
    assert before["version"] == 0
    # In flight when the reload started: finished on the old weights, reported as the old version everywhere.
    assert long["header"] == 0 and long["stamped"] == [0, 0]  # the final chunk and the usage chunk
    assert len(long["ids"]) == LONG
    assert long["ids"][:8] == before["ids"]
    assert long["logprobs"][:8] == pytest.approx(before["logprobs"], abs=1e-4)
    # Admitted after the reload: the new version, and the new weights' logprobs (= vLLM's own answer now).
    assert after["version"] == 1
    assert abs(after["logprobs"][0] - before["logprobs"][0]) > 1e-3, (before["logprobs"], after["logprobs"])
    assert after["logprobs"] == pytest.approx(out["direct"], abs=1e-4)
    assert out["reload_health"]["stats"]["reloads"] == 1 and out["reload_health"]["weights_path"] == str(v1)
    # Refused checkpoints (and a stale version) change nothing.
    assert out["refused"]["version"] == 1
    assert out["refused"]["logprobs"] == pytest.approx(after["logprobs"], abs=1e-4)
    assert out["health"]["weight_version"] == 1 and out["health"]["stats"]["reloads"] == 1
    assert out["health"]["status"] == "ok"
    assert out["restarted"]["version"] == 0
    assert out["restarted"]["logprobs"] == pytest.approx(before["logprobs"], abs=1e-4)
    # The gateway in front of the proxy records the version of the weights that served the call.
    assert record.weight_version == 1 and record.completion_token_ids
    assert len(record.completion_logprobs) == len(record.completion_token_ids)


async def gateway_call(engine_url: str, kafka: KafkaSettings, topic: contracts.Topic[Any]) -> ModelCallRecorded:
    from gateway import GatewaySettings
    from gateway import create_app as create_gateway

    port = free_port()
    settings = GatewaySettings(
        engine_urls=[engine_url],
        control_token=CONTROL,
        public_url=f"http://127.0.0.1:{port}",
        model_calls_topic=topic.name,
        default_max_tokens=4,
    )
    with running_app(create_gateway(settings, kafka=kafka), port) as url:
        async with httpx.AsyncClient(base_url=url, timeout=300) as client:
            r = await client.post(
                "/admin/sessions",
                json={"session_id": "proxy-e2e", "tokenization": "canonical", "model": "policy"},
                headers={"authorization": f"Bearer {CONTROL}"},
            )
            assert r.status_code == 200, r.text
            creds = r.json()
            chat = await client.post(
                creds["base_urls"]["openai"] + "/chat/completions",
                json={"model": "policy", "messages": MESSAGES, "max_tokens": 4, "temperature": 0},
                headers={"authorization": f"Bearer {creds['token']}"},
            )
            assert chat.status_code == 200, chat.text
    async with Consumer(kafka, [topic], group_id=f"proxy-test-{port}") as consumer:
        msg = await consumer.next(timeout_s=60)
    assert msg is not None, f"no ModelCallRecorded on {topic.name} within 60 s"
    return msg.event


@pytest.mark.integration
def test_vllm_down_is_a_clear_503_and_nothing_is_stamped_with_weights_not_loaded(
    dev_model_dir: Path,
    kafka_settings: KafkaSettings,
    topic_factory: Callable[..., contracts.Topic[Any]],
    serve: Callable[..., Any],
    tmp_path: Path,
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    topic = topic_factory(WEIGHTS)
    same = shutil.copytree(dev_model_dir, tmp_path / "v1")
    deeper, _ = incompatible_checkpoints(dev_model_dir, tmp_path)
    settings = InferenceSettings(
        engine="vllm", model_dir=dev_model_dir, vllm_url=dead, consume_weights=True, weights_topic=topic.name
    )

    async def scenario(url: str) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            await until(client, lambda h: h["weights_consumer"] == "ready", "weights consumer ready")
            started = time.monotonic()
            r = await client.post("/v1/chat/completions", json=body(4))
            assert time.monotonic() - started < 10  # never a hang
            assert r.status_code == 503 and dead in r.json()["error"]["message"], r.text
            assert r.json()["error"]["type"] == "service_unavailable"
            h = await client.get("/health")
            assert h.status_code == 503 and dead in h.json()["error"]
            await publish(
                kafka_settings,
                topic,
                WeightsPublished(version=1, uri=str(same), step=1),  # right shape, but vLLM cannot take it
                WeightsPublished(version=2, uri=str(deeper), step=2),
            )
            await until(client, lambda h: h["stats"]["failed"] == 1 and h["stats"]["refused"] == 1, "both rejected")
            h = await client.get("/health")
            assert (
                h.json()["weight_version"] == 0 and h.json()["admitting"] and h.headers["x-floe-weight-version"] == "0"
            )
            r = await client.post("/v1/completions", json={"model": "policy", "prompt": [1, 2], "max_tokens": 1})
            assert r.status_code == 503 and r.headers["x-floe-weight-version"] == "0"

    with serve(settings, kafka_settings, create_vllm_app) as url:
        asyncio.run(scenario(url))
