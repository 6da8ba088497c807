"""Real vLLM (CPU build) serving the real model: the token-level fields floe relies on, and the in-place reload.

One server for the whole session (``inference.testing.vllm_server``); calls are few and short (16 tokens, greedy) so
the module stays around a minute on a 2-core machine once the server is up.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from inference import InferenceSettings
from inference.testing import VllmServer, perturbed_checkpoint

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

MESSAGES = [{"role": "user", "content": "What is 2+3? Answer with one number."}]
GREEDY: dict[str, Any] = {"model": "policy", "max_tokens": 16, "temperature": 0.0, "seed": 7}


def chat(c: httpx.Client, **extra: Any) -> dict[str, Any]:
    body = {**GREEDY, "messages": MESSAGES, "logprobs": True, "top_logprobs": 2, "return_token_ids": True, **extra}
    r = c.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return dict(r.json())


def completion_logprobs(c: httpx.Client, prompt_ids: list[int], max_tokens: int = 8) -> tuple[list[int], list[float]]:
    body = {**GREEDY, "prompt": prompt_ids, "max_tokens": max_tokens, "logprobs": 1, "return_token_ids": True}
    r = c.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return list(choice["token_ids"]), list(choice["logprobs"]["token_logprobs"])


def test_chat_returns_consistent_token_ids_and_logprobs(vllm_server: VllmServer) -> None:
    with vllm_server.client() as c:
        out = chat(c)
        rendered = c.post("/tokenize", json={"model": "policy", "messages": MESSAGES, "add_generation_prompt": True})
        assert rendered.status_code == 200, rendered.text
        choice = out["choices"][0]
        ids: list[int] = choice["token_ids"]
        content = choice["logprobs"]["content"]
        # The ids the model consumed are the rendered chat template (floe's SmolLM2 template, default system prompt).
        assert out["prompt_token_ids"] == rendered.json()["tokens"]
        assert out["usage"]["prompt_tokens"] == len(out["prompt_token_ids"])
        assert len(ids) == len(content) == out["usage"]["completion_tokens"] >= 1
        for entry in content:
            tops = [t["logprob"] for t in entry["top_logprobs"]]
            assert len(tops) == 2 and tops == sorted(tops, reverse=True)
            # Greedy: the sampled token is the most likely one, and its raw logprob is the top one.
            assert entry["logprob"] == pytest.approx(tops[0], abs=1e-5)
        text = c.post("/detokenize", json={"model": "policy", "tokens": [i for i in ids if i != 2]}).json()["prompt"]
        assert choice["message"]["content"] == text
        assert choice["finish_reason"] in ("stop", "length")
        if choice["finish_reason"] == "stop":
            assert ids[-1] == 2  # <|im_end|>: vLLM returns the EOS id, as the CPU engine does


def test_token_in_completion_reproduces_the_chat_call(vllm_server: VllmServer) -> None:
    with vllm_server.client() as c:
        out = chat(c)
        ids, lps = completion_logprobs(c, out["prompt_token_ids"], max_tokens=16)
        choice = out["choices"][0]
        assert ids == choice["token_ids"]
        assert lps == pytest.approx([e["logprob"] for e in choice["logprobs"]["content"]], abs=1e-4)


def test_streaming_chat_carries_ids_per_chunk(vllm_server: VllmServer) -> None:
    with vllm_server.client() as c:
        whole = chat(c)
        body = {
            **GREEDY,
            "messages": MESSAGES,
            "logprobs": True,
            "return_token_ids": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        chunks: list[dict[str, Any]] = []
        with c.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(json.loads(line.removeprefix("data: ")))
        assert chunks[0]["prompt_token_ids"] == whole["prompt_token_ids"]
        choices = [ch["choices"][0] for ch in chunks if ch["choices"]]
        ids = [i for ch in choices for i in (ch.get("token_ids") or [])]
        text = "".join(ch["delta"].get("content") or "" for ch in choices)
        assert ids == whole["choices"][0]["token_ids"]
        assert text == whole["choices"][0]["message"]["content"]
        assert choices[-1]["finish_reason"] == whole["choices"][0]["finish_reason"]
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == len(ids)


def test_reload_weights_changes_logprobs_and_reloading_restores_them(
    vllm_server: VllmServer, real_model_dir: Path, tmp_path: Path
) -> None:
    other = perturbed_checkpoint(real_model_dir, tmp_path / "perturbed", tensor="model.norm.weight", scale=1.5)
    with vllm_server.client() as c:
        prompt = c.post("/tokenize", json={"model": "policy", "messages": MESSAGES, "add_generation_prompt": True})
        prompt_ids = prompt.json()["tokens"]
        base_ids, base = completion_logprobs(c, prompt_ids)
        try:
            vllm_server.reload(other)
            _, changed = completion_logprobs(c, prompt_ids)
            # The first token's distribution is computed from the same prompt: its logprob must move.
            assert abs(changed[0] - base[0]) > 1e-3, (base, changed)
        finally:
            vllm_server.reload(real_model_dir)  # the session's server must serve the real model for later tests
        ids, restored = completion_logprobs(c, prompt_ids)
        assert ids == base_ids
        assert restored == pytest.approx(base, abs=1e-5)


def test_cpu_engine_serves_the_same_model_with_the_same_ids_and_logprobs(
    vllm_server: VllmServer, real_model_dir: Path, serve: Callable[..., Any]
) -> None:
    settings = InferenceSettings(
        model_dir=real_model_dir, consume_weights=False, init_if_missing=False, threads=1, seed=1, max_model_len=2048
    )
    with vllm_server.client() as v, serve(settings) as cpu_url, httpx.Client(base_url=cpu_url, timeout=300) as c:
        theirs, ours = chat(v), chat(c)
        # Same checkpoint, template and tokenizer: the same prompt ids; fp32 on both: the same greedy tokens.
        assert ours["prompt_token_ids"] == theirs["prompt_token_ids"]
        assert ours["choices"][0]["token_ids"] == theirs["choices"][0]["token_ids"]
        assert ours["choices"][0]["message"]["content"] == theirs["choices"][0]["message"]["content"]
        lp = [[e["logprob"] for e in r["choices"][0]["logprobs"]["content"]] for r in (ours, theirs)]
        assert lp[0] == pytest.approx(lp[1], abs=1e-3)
