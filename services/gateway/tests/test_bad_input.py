"""Bad input gets the provider's own error shape and a 4xx, never a 5xx or a stack trace; nothing is recorded.

Includes a schemathesis run (property fuzzing from the gateway's OpenAPI) against the real gateway server with a
valid session token, checking that no generated request yields a server error. The number of cases it ran is
printed (``schemathesis cases: N``) for the closing note.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from gateway import GatewaySettings, create_app

from ._fakes import MemorySink, free_port, serve


@pytest.fixture
def tok(gw) -> str:
    return str(gw.session()["token"])


def _h(tok: str) -> dict[str, str]:
    return {
        "authorization": f"Bearer {tok}",
        "x-api-key": tok,
        "x-goog-api-key": tok,
        "content-type": "application/json",
    }


@pytest.mark.parametrize(
    ("path", "shape"),
    [
        ("/v1/chat/completions", "openai"),
        ("/v1/responses", "openai"),
        ("/v1/messages", "anthropic"),
        ("/v1/messages/count_tokens", "anthropic"),
        ("/v1beta/models/g:generateContent", "google"),
        ("/v1beta/models/g:streamGenerateContent", "google"),
    ],
)
@pytest.mark.parametrize("body", [b"{not json", b"[]", b'{"model": 3}', b"{}", b'{"messages": "nope", "model": "m"}'])
def test_malformed_bodies(gw, tok, path, shape, body) -> None:
    r = httpx.post(gw.url + path, content=body, headers=_h(tok))
    assert r.status_code == 400, r.text
    j = r.json()
    if shape == "openai":
        assert set(j["error"]) == {"message", "type", "param", "code"} and j["error"]["type"] == "invalid_request_error"
    elif shape == "anthropic":
        assert j["type"] == "error" and j["error"]["type"] == "invalid_request_error"
    else:
        assert j["error"]["code"] == 400 and j["error"]["status"] == "INVALID_ARGUMENT"
    assert "Traceback" not in r.text
    assert gw.sink.events == []


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/v1/chat/completions",
            {
                "model": "m",
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}],
                    }
                ],
            },
        ),
        (
            "/v1/responses",
            {"model": "m", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:x"}]}]},
        ),
        (
            "/v1beta/models/g:generateContent",
            {"contents": [{"role": "user", "parts": [{"inlineData": {"mimeType": "image/png", "data": "AAAA"}}]}]},
        ),
        ("/v1/chat/completions", {"model": "m", "messages": [{"role": "tool", "content": "x"}]}),
        ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 2}),
        ("/v1/responses", {"model": "m", "input": "x", "previous_response_id": "resp_1"}),
        ("/v1/messages", {"model": "m", "messages": [{"role": "user", "content": "x"}]}),  # no max_tokens
        (
            "/v1/chat/completions",
            {
                "model": "m",
                "messages": [
                    {"role": "user", "content": "x"},
                    {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{bad"}}]},
                    {"role": "tool", "tool_call_id": "c", "content": "r"},
                ],
            },
        ),
        (
            "/v1/responses",
            {
                "model": "m",
                "input": [
                    {"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"},
                    {"type": "function_call_output", "call_id": "c", "output": "r"},
                ],
            },
        ),
    ],
)
def test_semantically_invalid_requests(gw, tok, path, body) -> None:
    r = httpx.post(gw.url + path, json=body, headers=_h(tok))
    assert r.status_code == 400, r.text
    assert gw.sink.events == []


def test_unknown_routes_and_methods(gw, tok) -> None:
    r = httpx.post(gw.url + "/v1/nope", json={}, headers=_h(tok))
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = httpx.get(gw.url + "/v1/messages", headers=_h(tok))
    assert r.status_code == 404 and r.json()["type"] == "error"
    r = httpx.post(gw.url + "/v1beta/models/g:embedContent", json={}, headers=_h(tok))
    assert r.status_code == 404 and r.json()["error"]["status"] == "NOT_FOUND"
    r = httpx.post(gw.url + "/v1beta/models/g:countTokens", json={}, headers=_h(tok))
    assert r.status_code == 400 and r.json()["error"]["status"] == "INVALID_ARGUMENT"


def test_oversized_body_and_context_overflow(gw, tok) -> None:
    big = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x" * 40_000}]}
    r = httpx.post(gw.url + "/v1/messages", json=big, headers=_h(tok))
    assert r.status_code == 400 and "prompt is too long" in r.json()["error"]["message"]  # Claude Code's compaction cue
    r = httpx.post(gw.url + "/v1/chat/completions", json={**big, "max_tokens": None}, headers=_h(tok))
    assert r.json()["error"]["code"] == "context_length_exceeded"
    r = httpx.post(
        gw.url + "/v1beta/models/g:generateContent",
        json={"contents": [{"role": "user", "parts": [{"text": "x" * 40_000}]}]},
        headers=_h(tok),
    )
    assert r.status_code == 400 and "exceeds the maximum number of tokens" in r.json()["error"]["message"]
    assert gw.sink.events == []


def test_body_limit_and_strict_models(fake_engine) -> None:
    _, engine_url = fake_engine
    port = free_port()
    s = GatewaySettings(
        engine_urls=[engine_url],
        control_token="c",
        public_url=f"http://127.0.0.1:{port}",
        max_body_bytes=1000,
        strict_models=True,
        model_aliases=["alias"],
    )
    with serve(create_app(s, sink=MemorySink()), port) as url:
        tok = httpx.post(
            url + "/admin/sessions", json={"session_id": "a", "model": "pol"}, headers={"authorization": "Bearer c"}
        ).json()["token"]
        r = httpx.post(
            url + "/v1/messages",
            json={"model": "pol", "max_tokens": 1, "messages": [{"role": "user", "content": "x" * 2000}]},
            headers={"x-api-key": tok},
        )
        assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"
        r = httpx.post(
            url + f"/s/{tok}/v1/messages",
            json={"model": "pol", "max_tokens": 1, "messages": [{"role": "user", "content": "x" * 2000}]},
        )
        assert r.status_code == 413 and r.json()["type"] == "error"  # shape chosen after the /s/ prefix is removed

        def chunked() -> Iterator[bytes]:  # no content-length: the limit holds while the body is read
            yield b'{"model": "pol", "max_tokens": 1, "messages": [{"role": "user", "content": "'
            yield b"x" * 2000
            yield b'"}]}'

        r = httpx.post(url + "/v1/messages", content=chunked(), headers={"x-api-key": tok})
        assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"
        r = httpx.post(
            url + "/v1/chat/completions",
            json={"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]},
            headers={"authorization": f"Bearer {tok}"},
        )
        assert r.status_code == 404 and "gpt-9" in r.json()["error"]["message"]
        r = httpx.post(
            url + "/v1/chat/completions",
            json={"model": "alias", "messages": [{"role": "user", "content": "x"}]},
            headers={"authorization": f"Bearer {tok}"},
        )
        assert r.status_code == 200


@pytest.mark.slow
def test_fuzz_never_a_server_error(gw, capsys) -> None:
    """Every operation of the OpenAPI schema, hypothesis-generated cases (positive and negative), a valid token."""
    tok = gw.session("fuzz")["token"]
    schema = schemathesis.openapi.from_url(gw.url + "/openapi.json")
    auth = {"authorization": f"Bearer {tok}", "x-api-key": tok, "x-goog-api-key": tok}
    count = 0
    failures: list[str] = []
    for result in schema.get_all_operations():
        operation = result.ok()

        @given(case=operation.as_strategy())
        @settings(
            max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), database=None, derandomize=True
        )
        def run(case) -> None:
            nonlocal count
            response = case.call(headers={**(case.headers or {}), **auth}, timeout=10)
            count += 1
            if response.status_code >= 500:
                failures.append(f"{case.method} {case.path}: {response.status_code} {response.text[:300]}")
            elif response.status_code >= 400 and "error" not in response.json():
                failures.append(f"{case.method} {case.path}: error without provider shape {response.text[:200]}")

        run()
    with capsys.disabled():
        print(f"\nschemathesis cases: {count}")
    assert count > 80
    assert failures == []
