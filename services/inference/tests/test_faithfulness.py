"""Token faithfulness: what the server returns is exactly what a teacher-forced forward pass computes.

Requests are sent concurrently to a server with a generous batching window so they share waves (left padding,
chunked prefill, KV-cache decode); each one is then checked alone, without padding or cache, against the checkpoint.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from inference import InferenceSettings
from inference.checkpoint import load_model, load_tokenizer


async def _fire(base_url: str, requests: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
        responses = await asyncio.gather(*(client.post(path, json=body) for path, body in requests))
    for r in responses:
        assert r.status_code == 200, r.text
    return [r.json() for r in responses]


def test_logprobs_and_ids_are_faithful_under_batching(
    serve: Callable[..., Any],
    make_settings: Callable[..., InferenceSettings],
    dev_model_dir: Path,
    teacher_forced_logprobs: Callable[..., list[float]],
) -> None:
    prompts = ["hi", "def f(x):\n    return x", "Please fix the bug in the parser " * 3, "🚀 ok"]
    requests: list[tuple[str, dict[str, Any]]] = []
    for i, text in enumerate(prompts):
        sampling = {"max_tokens": 24, "seed": 100 + i, "temperature": [1.0, 0.7, 1.3, 0.0][i], "return_token_ids": True}
        if i % 2:
            sampling.update(top_p=0.9, top_k=50)
        requests.append(
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": text}], "logprobs": True, **sampling})
        )
        requests.append(("/v1/completions", {"prompt": text, "logprobs": 0, **sampling}))
    settings = make_settings(batch_wait_ms=300, max_batch=8, prefill_chunk=16)
    with serve(settings) as url:
        results = asyncio.run(_fire(url, requests))
        stats = httpx.get(f"{url}/health").json()["stats"]
    assert stats["prefills"] < len(requests), f"requests were not batched: {stats}"

    model = load_model(dev_model_dir)
    tok = load_tokenizer(dev_model_dir)
    checked = 0
    for (path, _), body in zip(requests, results, strict=True):
        choice = body["choices"][0]
        completion = choice["token_ids"]
        if path == "/v1/chat/completions":
            prompt = body["prompt_token_ids"]
            returned = [e["logprob"] for e in choice["logprobs"]["content"]]
        else:
            prompt = choice["prompt_token_ids"]
            returned = choice["logprobs"]["token_logprobs"]
            # Ids -> text, never the other way round: the text is exactly the detokenized sampled ids.
            assert tok.decode(completion, skip_special_tokens=True) == choice["text"]
        assert len(returned) == len(completion) >= 1
        expected = teacher_forced_logprobs(model, prompt, completion)
        worst = max(abs(a - b) for a, b in zip(returned, expected, strict=True))
        assert worst < 1e-4, f"{path}: max |Δlogprob| = {worst}"
        checked += len(completion)
    assert checked >= 8 * 1


async def _staggered(base_url: str, bodies: list[dict[str, Any]], gap_s: float) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:

        async def send(i: int, body: dict[str, Any]) -> dict[str, Any]:
            await asyncio.sleep(i * gap_s)
            resp = await client.post("/v1/completions", json=body)
            assert resp.status_code == 200, resp.text
            return dict(resp.json())

        return list(await asyncio.gather(*(send(i, b) for i, b in enumerate(bodies))))


def test_requests_joining_and_leaving_a_running_batch_stay_faithful(
    serve: Callable[..., Any],
    make_settings: Callable[..., InferenceSettings],
    dev_model_dir: Path,
    teacher_forced_logprobs: Callable[..., list[float]],
) -> None:
    """Rows join mid-generation (cache merge with left padding) and retire at different steps (cache trimming)."""
    texts = ["a", "longer prompt about the repository layout " * 4, "mid size prompt", "x y z", "🚀" * 7, "tail"]
    bodies = [
        {
            "prompt": t,
            # The first request runs long so that later ones must join it mid-generation; the rest end at
            # different steps, so rows also leave while others keep decoding.
            "max_tokens": 150 if i == 0 else 6 + 7 * (i % 3),
            "ignore_eos": True,
            "seed": i,
            "logprobs": 1,
            "return_token_ids": True,
        }
        for i, t in enumerate(texts)
    ]
    with serve(make_settings(batch_wait_ms=0, max_batch=4, prefill_chunk=32)) as url:
        results = asyncio.run(_staggered(url, bodies, gap_s=0.03))
        stats = httpx.get(f"{url}/health").json()["stats"]
    assert stats["joins"] >= 1, stats
    model = load_model(dev_model_dir)
    for body, result in zip(bodies, results, strict=True):
        choice = result["choices"][0]
        assert len(choice["token_ids"]) == body["max_tokens"]
        expected = teacher_forced_logprobs(model, choice["prompt_token_ids"], choice["token_ids"])
        worst = max(abs(a - b) for a, b in zip(choice["logprobs"]["token_logprobs"], expected, strict=True))
        assert worst < 1e-4, f"max |Δlogprob| = {worst}"
