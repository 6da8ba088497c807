"""The official ``openai`` SDK against the real server: chat (plain, streaming, tools), token-in completions,
models, tokenize/detokenize, and OpenAI-shaped 4xx errors for bad input."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from inference import WEIGHT_VERSION_HEADER

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    }
]


@pytest.fixture(scope="module")
def client(base_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def http(base_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base_url, timeout=60) as c:
        yield c


def test_chat_plain_returns_vllm_token_fields(client: openai.OpenAI, http: httpx.Client) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="policy",
        messages=[{"role": "user", "content": "Say hi"}],
        max_tokens=12,
        logprobs=True,
        top_logprobs=3,
        seed=7,
        extra_body={"return_token_ids": True},
    )
    resp = raw.parse()
    body = resp.model_dump()
    assert raw.headers[WEIGHT_VERSION_HEADER] == "0" and body["weight_version"] == 0
    choice = body["choices"][0]
    expected_prompt = http.post("/tokenize", json={"messages": [{"role": "user", "content": "Say hi"}]}).json()
    assert body["prompt_token_ids"] == expected_prompt["tokens"]
    ids = choice["token_ids"]
    assert 1 <= len(ids) <= 12 and body["usage"]["completion_tokens"] == len(ids)
    assert body["usage"]["prompt_tokens"] == len(body["prompt_token_ids"])
    content = choice["logprobs"]["content"]
    assert len(content) == len(ids)
    for entry in content:
        assert set(entry) >= {"token", "logprob", "bytes", "top_logprobs"}
        assert entry["logprob"] <= 0 and len(entry["top_logprobs"]) == 3
        assert entry["top_logprobs"][0]["logprob"] >= entry["logprob"]
    assert choice["finish_reason"] in {"stop", "length"}


def test_chat_streaming_matches_non_streaming_for_the_same_seed(client: openai.OpenAI) -> None:
    kwargs = {
        "model": "policy",
        "messages": [{"role": "user", "content": "Count to three"}],
        "max_tokens": 16,
        "seed": 11,
        "temperature": 0.9,
        "extra_body": {"return_token_ids": True},
    }
    full = client.chat.completions.create(**kwargs).model_dump()  # type: ignore[call-overload]
    stream = client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs)  # type: ignore[call-overload]
    chunks = [c.model_dump() for c in stream]
    ids = [t for c in chunks for ch in c["choices"] for t in (ch.get("token_ids") or [])]
    assert ids == full["choices"][0]["token_ids"]
    assert chunks[0]["prompt_token_ids"] == full["prompt_token_ids"]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(ch["delta"].get("content") or "" for c in chunks for ch in c["choices"])
    reasoning = "".join(ch["delta"].get("reasoning_content") or "" for c in chunks for ch in c["choices"])
    assert text == (full["choices"][0]["message"]["content"] or "")
    assert reasoning == (full["choices"][0]["message"]["reasoning_content"] or "")
    final = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(final) == 1 and final[0]["weight_version"] == 0
    assert chunks[-1]["usage"]["completion_tokens"] == len(ids)


def _sse_chunks(http: httpx.Client, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with http.stream("POST", path, json={**body, "stream": True}) as r:
        r.raise_for_status()
        lines = [line[5:].strip() for line in r.iter_lines() if line.startswith("data:")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_stream_interval_batches_tokens_and_loses_none(http: httpx.Client, path: str) -> None:
    """vLLM's ``stream_interval``: the first token at once, then chunks of ``interval`` tokens, the rest at the end;
    the same ids, logprobs and text as one event per token."""
    body: dict[str, Any] = {"model": "policy", "max_tokens": 10, "seed": 4, "ignore_eos": True}
    body |= {"return_token_ids": True, "stream_options": {"include_usage": True}}
    if path.endswith("chat/completions"):
        body |= {"messages": [{"role": "user", "content": "Count to ten"}], "logprobs": True}
    else:
        body |= {"prompt": "def add(a, b):\n", "logprobs": 1}
    per_token = _sse_chunks(http, path, body)
    batched = _sse_chunks(http, path, {**body, "stream_interval": 4})

    def tokens(chunks: list[dict[str, Any]]) -> list[list[int]]:
        return [c["choices"][0]["token_ids"] for c in chunks if c["choices"] and c["choices"][0].get("token_ids")]

    def logprobs(chunks: list[dict[str, Any]]) -> list[float]:
        out: list[float] = []
        for c in chunks:
            lp = c["choices"][0]["logprobs"] if c["choices"] else None
            if lp:
                out += [e["logprob"] for e in lp["content"]] if "content" in lp else lp["token_logprobs"]
        return out

    def text(chunks: list[dict[str, Any]]) -> str:
        choices = [c["choices"][0] for c in chunks if c["choices"]]
        return "".join((ch.get("delta") or {}).get("content") or ch.get("text") or "" for ch in choices)

    assert [len(t) for t in tokens(per_token)] == [1] * 10
    assert [len(t) for t in tokens(batched)] == [1, 4, 4, 1]
    assert [t for c in tokens(batched) for t in c] == [t for c in tokens(per_token) for t in c]
    assert logprobs(batched) == logprobs(per_token) and len(logprobs(batched)) == 10
    assert text(batched) == text(per_token)
    assert batched[-1]["usage"] == per_token[-1]["usage"]
    if path == "/v1/completions":  # offsets of the legacy logprobs run on across chunks
        offsets = [
            o
            for c in batched
            if c["choices"] and c["choices"][0]["logprobs"]
            for o in c["choices"][0]["logprobs"]["text_offset"]
        ]
        assert offsets == [
            o
            for c in per_token
            if c["choices"] and c["choices"][0]["logprobs"]
            for o in c["choices"][0]["logprobs"]["text_offset"]
        ]
    bad = http.post(path, json={**body, "stream": True, "stream_interval": 0})
    assert bad.status_code == 400 and "stream_interval" in bad.text


def test_chat_with_tools_and_tool_history(client: openai.OpenAI, http: httpx.Client) -> None:
    messages: list[Any] = [
        {"role": "user", "content": "read a.txt"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path": "a.txt"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "hello world"},
    ]
    resp = client.chat.completions.create(
        model="policy",
        messages=messages,
        tools=TOOLS,
        max_tokens=10,
        extra_body={"return_token_ids": True},
    )
    body = resp.model_dump()
    rendered = http.post("/detokenize", json={"tokens": body["prompt_token_ids"]}).json()["prompt"]
    assert '"name": "read_file"' in rendered and "<tools>" in rendered
    assert '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.txt"}}\n</tool_call>' in rendered
    assert "<tool_response>\nhello world\n</tool_response>" in rendered
    assert resp.choices[0].finish_reason in {"stop", "length", "tool_calls"}
    streamed = client.chat.completions.create(
        model="policy",
        messages=messages,
        tools=TOOLS,
        max_tokens=10,
        stream=True,
    )
    assert sum(1 for _ in streamed) >= 2


def test_token_in_completions(client: openai.OpenAI, http: httpx.Client) -> None:
    prompt = http.post("/tokenize", json={"prompt": "def add(a, b):\n"}).json()["tokens"]
    resp = client.completions.create(
        model="policy", prompt=prompt, max_tokens=8, logprobs=2, seed=3, extra_body={"return_token_ids": True}
    )
    choice = resp.model_dump()["choices"][0]
    assert choice["prompt_token_ids"] == prompt
    ids = choice["token_ids"]
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(ids)
    for tok, top in zip(lp["tokens"], lp["top_logprobs"], strict=True):
        assert tok in top and len(top) >= 2
    detok = http.post("/detokenize", json={"tokens": ids}).json()["prompt"]
    assert choice["text"] in detok  # detokenize keeps special tokens; the text skips them
    stream = client.completions.create(
        model="policy", prompt=prompt, max_tokens=8, seed=3, stream=True, extra_body={"return_token_ids": True}
    )
    chunks = [c.model_dump() for c in stream]
    assert [t for c in chunks for t in (c["choices"][0].get("token_ids") or [])] == ids
    assert "".join(c["choices"][0]["text"] for c in chunks) == choice["text"]
    assert chunks[-1]["weight_version"] == 0


def test_return_tokens_as_token_ids(http: httpx.Client) -> None:
    body = http.post(
        "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 4,
            "logprobs": True,
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
        },
    ).json()
    tokens = [e["token"] for e in body["choices"][0]["logprobs"]["content"]]
    assert tokens == [f"token_id:{i}" for i in body["choices"][0]["token_ids"]]


def test_stop_string_truncates_text(http: httpx.Client) -> None:
    base = {"prompt": "alpha beta", "max_tokens": 24, "seed": 5, "return_token_ids": True}
    free = http.post("/v1/completions", json=base).json()["choices"][0]
    text = free["text"]
    if len(text) < 4:
        pytest.fail(f"seeded sample too short to pick a stop string from: {text!r}")
    stop = text[2:4]
    cut = http.post("/v1/completions", json={**base, "stop": [stop]}).json()["choices"][0]
    assert cut["finish_reason"] == "stop" and cut["stop_reason"] == stop
    assert cut["text"] == text[: text.find(stop)]
    assert free["token_ids"][: len(cut["token_ids"])] == cut["token_ids"]


def test_models_tokenize_detokenize_health(client: openai.OpenAI, http: httpx.Client) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == ["policy"]
    card = models.data[0].model_dump()
    assert card["max_model_len"] == 4096 and card["weight_version"] == 0
    tok = http.post("/tokenize", json={"prompt": "héllo 🚀", "return_token_strs": True}).json()
    assert tok["count"] == len(tok["tokens"]) == len(tok["token_strs"]) and tok["max_model_len"] == 4096
    assert http.post("/detokenize", json={"tokens": tok["tokens"]}).json()["prompt"] == "héllo 🚀"
    chat = http.post(
        "/tokenize",
        json={"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, "add_generation_prompt": True},
    ).json()
    text = http.post("/detokenize", json={"tokens": chat["tokens"]}).json()["prompt"]
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n") and "read_file" in text
    health = http.get("/health")
    assert health.status_code == 200 and health.json()["weight_version"] == 0
    assert health.headers[WEIGHT_VERSION_HEADER] == "0"


@pytest.mark.parametrize(
    ("path", "body", "status", "code"),
    [
        ("/v1/chat/completions", {"messages": []}, 400, None),
        ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, 400, None),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "temperature": -1}, 400, None),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 2}, 400, None),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 50, "logprobs": True},
            400,
            None,
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "max_tokens": 5000},
            400,
            "context_length_exceeded",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "model": "gpt-9"},
            404,
            "model_not_found",
        ),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": 12}]}, 400, None),
        ("/v1/completions", {"prompt": [1, 2, 999999]}, 400, None),
        ("/v1/completions", {"prompt": [1, -4]}, 400, None),
        ("/v1/completions", {"prompt": []}, 400, None),
        ("/v1/completions", {"prompt": [[1, 2], [3, 4]]}, 400, None),
        ("/v1/completions", {"prompt": list(range(5000))}, 400, "context_length_exceeded"),
        ("/v1/completions", {"prompt": [1, 2], "stop": [""]}, 400, None),
        ("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, 400, None),
        ("/detokenize", {"tokens": [10**9]}, 400, None),
    ],
)
def test_bad_input_gets_openai_shaped_4xx(
    http: httpx.Client, path: str, body: dict[str, object], status: int, code: str | None
) -> None:
    resp = http.post(path, json=body)
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["code"] == code


def test_malformed_json_and_sdk_error_mapping(http: httpx.Client, client: openai.OpenAI) -> None:
    resp = http.post("/v1/chat/completions", content=b"{nope", headers={"content-type": "application/json"})
    assert resp.status_code == 400 and "JSON" in resp.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "x " * 3000}], max_tokens=10
        )
    assert info.value.code == "context_length_exceeded"
    assert http.get("/health").status_code == 200  # still serving after all of that
    assert json.loads(http.get("/v1/models").text)["data"][0]["id"] == "policy"
