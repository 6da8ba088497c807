"""Anthropic Messages through the gateway with the official ``anthropic`` SDK (fake engine, real HTTP)."""

from __future__ import annotations

import anthropic
import httpx
import pytest

from ._fakes import decode, logprob

TOOLS = [{"name": "get_weather", "description": "w", "input_schema": {"type": "object", "properties": {}}}]


def _client(creds, *, bearer: bool = False) -> anthropic.Anthropic:
    if bearer:
        return anthropic.Anthropic(base_url=creds["base_urls"]["anthropic"], auth_token=creds["token"], max_retries=0)
    return anthropic.Anthropic(base_url=creds["base_urls"]["anthropic"], api_key=creds["token"], max_retries=0)


def test_claude_code_shaped_request_non_streaming(gw) -> None:
    creds = gw.session()
    out = _client(creds).messages.create(
        model="claude-sonnet-4",
        max_tokens=16000,
        system=[
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197.d49; cc_entrypoint=sdk-cli;"},
            {"type": "text", "text": "You are Claude.", "cache_control": {"type": "ephemeral"}},
        ],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "hello there"}]},
            {"role": "system", "content": "agent types..."},
        ],
        tools=TOOLS,
        extra_body={
            "thinking": {"type": "adaptive"},
            "context_management": {"edits": []},
            "output_config": {"effort": "high"},
        },
    )
    assert out.content[0].type == "text"
    assert out.content[0].text == "Hello! You said: hello there"
    assert out.stop_reason == "end_turn"
    [rec] = gw.sink.events
    assert decode(rec.completion_token_ids) == out.content[0].text
    assert rec.completion_logprobs == [logprob(i) for i in range(len(rec.completion_token_ids))]
    assert "billing" not in str(rec.request["messages"])
    assert any(c.startswith("removed_volatile") for c in rec.gateway_changes)
    assert out.usage.output_tokens == len(rec.completion_token_ids)


def test_streaming_tool_use_and_round_trip(gw) -> None:
    creds = gw.session()
    client = _client(creds, bearer=True)
    msgs = [{"role": "user", "content": "CALL_TOOL now"}]
    events = []
    with client.messages.stream(model="m", max_tokens=200, messages=msgs, tools=TOOLS) as s:
        for ev in s:
            events.append(ev.type)
        final = s.get_final_message()
    assert events[0] == "message_start"
    assert "content_block_delta" in events
    assert events[-1] == "message_stop"
    assert final.stop_reason == "tool_use"
    text = [b for b in final.content if b.type == "text"]
    [tool] = [b for b in final.content if b.type == "tool_use"]
    assert text[0].text == "Let me check."
    assert tool.name == "get_weather" and tool.input == {"city": "Paris"}
    msgs2 = [
        *msgs,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in final.content]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": tool.id,
                    "content": "sunny",
                    "cache_control": {"type": "ephemeral"},
                }
            ],
        },
    ]
    with client.messages.stream(model="m", max_tokens=200, messages=msgs2, tools=TOOLS) as s:
        text2 = "".join(s.text_stream)
    assert text2 == "The tool said: sunny"
    rec = gw.sink.events[-1]
    assert decode(rec.completion_token_ids) == text2
    assert rec.call_index == 1 and rec.prefix_extends_previous is True


def test_thinking_blocks_stream(gw) -> None:
    creds = gw.session()
    with _client(creds).messages.stream(
        model="m", max_tokens=100, messages=[{"role": "user", "content": "THINK"}]
    ) as s:
        final = s.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == "I should greet."
    assert final.content[1].text == "Hi there."


def test_count_tokens(gw) -> None:
    creds = gw.session()
    n = _client(creds).messages.count_tokens(model="m", messages=[{"role": "user", "content": "hi"}])
    assert n.input_tokens > 0


def test_image_is_a_provider_shaped_400(gw) -> None:
    creds = gw.session()
    with pytest.raises(anthropic.BadRequestError) as ei:
        _client(creds).messages.create(
            model="m",
            max_tokens=10,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
                    ],
                }
            ],
        )
    assert ei.value.body["type"] == "error"
    assert ei.value.body["error"]["type"] == "invalid_request_error"
    assert "not supported" in ei.value.body["error"]["message"]
    assert gw.sink.events == []


def test_head_preflight_and_beta_query(gw) -> None:
    creds = gw.session()
    assert httpx.head(gw.url + "/").status_code == 200
    r = httpx.post(
        gw.url + "/v1/messages?beta=true",
        headers={"x-api-key": creds["token"]},
        json={"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code == 200 and r.json()["type"] == "message"
