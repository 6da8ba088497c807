"""OpenAI Chat through the gateway with the official ``openai`` SDK, against the fake engine over real HTTP."""

from __future__ import annotations

import json

import openai
import pytest

from ._fakes import IM_END, decode, logprob


def _client(gw, creds) -> openai.OpenAI:
    return openai.OpenAI(base_url=creds["base_urls"]["openai"], api_key=creds["token"], max_retries=0)


def test_non_streaming_text_is_recorded(gw) -> None:
    creds = gw.session()
    out = _client(gw, creds).chat.completions.create(
        model="floe-policy", messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    )
    assert out.choices[0].message.content == "Hello! You said: hi"
    assert out.choices[0].finish_reason == "stop"
    [rec] = gw.sink.events
    assert rec.session_id == "s1" and rec.call_index == 0 and rec.protocol.value == "openai_chat"
    assert decode(rec.completion_token_ids) == out.choices[0].message.content
    assert rec.completion_token_ids[-1] == IM_END
    assert rec.completion_logprobs == [logprob(i) for i in range(len(rec.completion_token_ids))]
    assert rec.weight_version == 3
    assert out.usage.completion_tokens == len(rec.completion_token_ids)
    assert out.usage.prompt_tokens == rec.prompt_len


def test_streaming_text_equals_record(gw) -> None:
    creds = gw.session()
    stream = _client(gw, creds).chat.completions.create(
        model="floe-policy",
        messages=[{"role": "user", "content": "stream me"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage = "", None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    [rec] = gw.sink.events
    assert text == decode(rec.completion_token_ids) == "Hello! You said: stream me"
    assert finish == "stop" and usage is not None and usage.completion_tokens == len(rec.completion_token_ids)


@pytest.mark.parametrize("stream", [False, True])
def test_parallel_tool_calls_and_round_trip(gw, stream: bool) -> None:
    creds = gw.session()
    client = _client(gw, creds)
    tools = [
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
    ]
    msgs = [{"role": "user", "content": "TWO_TOOLS please"}]
    if stream:
        calls: dict[int, dict] = {}
        finish = None
        for chunk in client.chat.completions.create(model="m", messages=msgs, tools=tools, stream=True):
            for c in chunk.choices:
                finish = c.finish_reason or finish
                for tc in c.delta.tool_calls or []:
                    slot = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                    slot["id"] += tc.id or ""
                    slot["name"] += (tc.function.name or "") if tc.function else ""
                    slot["arguments"] += (tc.function.arguments or "") if tc.function else ""
        got = [calls[i] for i in sorted(calls)]
    else:
        out = client.chat.completions.create(model="m", messages=msgs, tools=tools)
        finish = out.choices[0].finish_reason
        got = [
            {"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
            for c in out.choices[0].message.tool_calls
        ]
    assert finish == "tool_calls"
    assert [g["name"] for g in got] == ["get_weather", "get_time"]
    assert json.loads(got[0]["arguments"]) == {"city": "Paris"}
    rec = gw.sink.events[-1]
    assert rec.finish_reason == "tool_calls"
    assert "<tool_call>" in decode(rec.completion_token_ids)
    # the harness replays the calls with results, qwen-style list content, content None
    msgs2 = [
        *msgs,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": g["id"], "type": "function", "function": {"name": g["name"], "arguments": g["arguments"]}}
                for g in got
            ],
        },
        {"role": "tool", "tool_call_id": got[0]["id"], "content": [{"type": "text", "text": "sunny"}]},
        {"role": "tool", "tool_call_id": got[1]["id"], "content": "noon"},
    ]
    out2 = client.chat.completions.create(model="m", messages=msgs2, tools=tools)
    assert out2.choices[0].message.content == "The tool said: noon"
    rec2 = gw.sink.events[-1]
    assert rec2.call_index == 1
    assert rec2.prefix_extends_previous is True  # canonical mode, the fake template is append-only


def test_reasoning_is_split_out(gw) -> None:
    creds = gw.session()
    out = _client(gw, creds).chat.completions.create(model="m", messages=[{"role": "user", "content": "THINK"}])
    msg = out.choices[0].message
    assert msg.content == "Hi there."
    assert msg.model_extra["reasoning_content"] == "I should greet."


def test_a_session_records_request_deltas_that_rebuild_every_request(gw) -> None:
    """v2 records: each call after the first carries only its new messages; the decoder rebuilds what was sent."""
    from contracts import decode_requests

    creds = gw.session()
    client = _client(gw, creds)
    tools = [{"type": "function", "function": {"name": "bash", "description": "run", "parameters": {"type": "object"}}}]
    messages: list[dict[str, str]] = [{"role": "system", "content": "you are a coding agent " * 20}]
    for i in range(3):
        messages.append({"role": "user", "content": f"step {i}"})
        out = client.chat.completions.create(model="floe-policy", messages=messages, tools=tools)
        messages.append({"role": "assistant", "content": out.choices[0].message.content or ""})
    recs = sorted(gw.sink.events, key=lambda r: r.call_index)
    full = decode_requests(recs)
    assert [[(m["role"], m["content"]) for m in f["messages"]] for f in full] == [
        [(m["role"], m["content"]) for m in messages[: 2 + 2 * i]] for i in range(3)
    ]
    assert all(f["tools"] == full[0]["tools"] and f["tools"][0]["function"]["name"] == "bash" for f in full)
    later = recs[1:]
    assert all(r.request_base_call_index == r.call_index - 1 and "tools" in r.request_same for r in later)
    assert all(len(r.request["messages"]) == 2 for r in later)  # the previous answer and the new user turn
