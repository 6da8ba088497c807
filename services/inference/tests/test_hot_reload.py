"""Hot reload over the real broker: publish ``WeightsPublished`` while requests are in flight.

Every request must succeed; each must report the version whose weights produced *all* its tokens (checked by
teacher-forcing against both checkpoints); new requests pick up the new version; versions never go backwards.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

import contracts
from eventbus import KafkaSettings, Producer
from inference import InferenceSettings, save_checkpoint
from inference.checkpoint import load_model


def perturbed_checkpoint(src: Path, out: Path, version: int) -> Path:
    model = load_model(src)
    gen = torch.Generator().manual_seed(version)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.5)
    return save_checkpoint(model, src, out, version=version)


async def _stream(client: httpx.AsyncClient, body: dict[str, Any], first_token: asyncio.Event) -> dict[str, Any]:
    ids: list[int] = []
    lps: list[float] = []
    prompt: list[int] = []
    version = None
    async with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as resp:
        assert resp.status_code == 200, await resp.aread()
        header = int(resp.headers["x-floe-weight-version"])
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            prompt = chunk.get("prompt_token_ids") or prompt
            for ch in chunk["choices"]:
                ids += ch.get("token_ids") or []
                lps += [e["logprob"] for e in (ch.get("logprobs") or {}).get("content") or []]
                if ch.get("finish_reason"):
                    version = chunk["weight_version"]
            if ids:
                first_token.set()
    assert version == header
    return {"prompt": prompt, "ids": ids, "logprobs": lps, "version": version}


async def _post(client: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    resp = await client.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    data = resp.json()
    assert int(resp.headers["x-floe-weight-version"]) == data["weight_version"]
    return {
        "prompt": data["prompt_token_ids"],
        "ids": data["choices"][0]["token_ids"],
        "logprobs": [e["logprob"] for e in data["choices"][0]["logprobs"]["content"]],
        "version": data["weight_version"],
    }


def body(i: int, max_tokens: int) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": f"request {i}: summarise the repository"}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "seed": 42,
        "logprobs": True,
        "return_token_ids": True,
    }


@pytest.mark.integration
def test_weights_swap_while_requests_in_flight(
    serve: Callable[..., Any],
    make_settings: Callable[..., InferenceSettings],
    dev_model_dir: Path,
    kafka_settings: KafkaSettings,
    topic_factory: Callable[..., contracts.Topic[Any]],
    tmp_path: Path,
    teacher_forced_logprobs: Callable[..., list[float]],
) -> None:
    topic = topic_factory(contracts.WEIGHTS)
    v1_dir = perturbed_checkpoint(dev_model_dir, tmp_path / "v1", version=1)
    settings = make_settings(consume_weights=True, weights_topic=topic.name, max_batch=4, batch_wait_ms=0)

    async def scenario(url: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            deadline = time.monotonic() + 60
            while (await client.get("/health")).json()["weights_consumer"] != "ready":
                assert time.monotonic() < deadline, "weights consumer never became ready"
                await asyncio.sleep(0.05)
            before = await _post(client, body(0, 8))
            first = asyncio.Event()
            # 6 long streams on a 4-row batch: 4 run in the first wave, 2 queue behind it.
            in_flight = [asyncio.create_task(_stream(client, body(i, 120), first)) for i in range(1, 7)]
            await asyncio.wait_for(first.wait(), 30)
            async with Producer(kafka_settings) as producer:
                await producer.send(topic, contracts.WeightsPublished(version=1, uri=str(v1_dir), step=1))
                # A stale (older) version published afterwards must be ignored.
                await producer.send(topic, contracts.WeightsPublished(version=0, uri=str(dev_model_dir), step=0))
            later: list[dict[str, Any]] = []
            while not later or later[-1]["version"] != 1:
                assert time.monotonic() < deadline + 60, "new weights were never applied"
                later.append(await _post(client, body(0, 8)))
            streams = await asyncio.gather(*in_flight)
            later.append(await _post(client, body(0, 8)))
            health = (await client.get("/health")).json()
            return [before, *later], streams, health

    with serve(settings, kafka=kafka_settings) as url:
        sequential, streams, health = asyncio.run(scenario(url))

    assert health["weight_version"] == 1 and health["stats"]["swaps"] == 1
    versions = [r["version"] for r in sequential]
    assert versions == sorted(versions), f"versions went backwards: {versions}"
    assert versions[0] == 0 and versions[-1] == 1
    assert all(len(s["ids"]) == 120 for s in streams)  # every in-flight request completed
    assert {s["version"] for s in streams} <= {0, 1} and any(s["version"] == 0 for s in streams)

    models = {0: load_model(dev_model_dir), 1: load_model(v1_dir)}
    for result in [*sequential, *streams]:
        expected = teacher_forced_logprobs(models[result["version"]], result["prompt"], result["ids"])
        worst = max(abs(a - b) for a, b in zip(result["logprobs"], expected, strict=True))
        assert worst < 1e-4, f"tokens of a v{result['version']} response were not produced by v{result['version']}"
    # Same seeded request, before and after the swap: the new weights change the output.
    old, new = sequential[0], sequential[-1]
    assert old["prompt"] == new["prompt"]
    assert old["logprobs"] != new["logprobs"]
