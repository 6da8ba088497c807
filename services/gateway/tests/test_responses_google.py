"""OpenAI Responses (``openai`` SDK) and Google (``google-genai`` SDK) through the gateway (fake engine)."""

from __future__ import annotations

import json

import openai
from google import genai
from google.genai import types as gt

from ._fakes import decode, logprob

FN_TOOL = {"type": "function", "name": "get_weather", "description": "w", "parameters": {"type": "object"}}


def _oa(creds) -> openai.OpenAI:
    return openai.OpenAI(base_url=creds["base_urls"]["openai"], api_key=creds["token"], max_retries=0)


def test_responses_non_streaming(gw) -> None:
    creds = gw.session()
    out = _oa(creds).responses.create(model="m", input="hello", instructions="be nice")
    assert out.output_text == "Hello! You said: hello"
    assert out.status == "completed"
    [rec] = gw.sink.events
    assert decode(rec.completion_token_ids) == out.output_text
    assert rec.protocol.value == "openai_responses"


def test_responses_codex_shaped_stream_with_tool_round_trip(gw) -> None:
    creds = gw.session()
    client = _oa(creds)
    inp = [
        {"type": "message", "id": "msg_1", "role": "developer", "content": [{"type": "input_text", "text": "sys"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "CALL_TOOL x"}]},
    ]
    tools = [FN_TOOL, {"type": "web_search", "external_web_access": False}]
    types, final = [], None
    for ev in client.responses.create(
        model="m",
        input=inp,
        tools=tools,
        stream=True,
        store=False,
        reasoning={"summary": "auto"},
        include=["reasoning.encrypted_content"],
    ):
        types.append(ev.type)
        if ev.type == "response.completed":
            final = ev.response
    assert types[0] == "response.created" and types[-1] == "response.completed"
    assert final is not None
    calls = [o for o in final.output if o.type == "function_call"]
    msgs = [o for o in final.output if o.type == "message"]
    assert msgs[0].content[0].text == "Let me check."
    assert calls[0].name == "get_weather" and json.loads(calls[0].arguments) == {"city": "Paris"}
    inp2 = [
        *inp,
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me check."}]},
        {
            "type": "function_call",
            "id": calls[0].id,
            "call_id": calls[0].call_id,
            "name": "get_weather",
            "arguments": calls[0].arguments,
            "status": "completed",
        },
        {"type": "function_call_output", "id": "fco_1", "call_id": calls[0].call_id, "output": "rain"},
    ]
    out2 = client.responses.create(model="m", input=inp2, tools=tools)
    assert out2.output_text == "The tool said: rain"
    assert gw.sink.events[-1].prefix_extends_previous is True


def test_google_generate_and_stream(gw) -> None:
    creds = gw.session()
    client = genai.Client(api_key=creds["token"], http_options=gt.HttpOptions(base_url=creds["base_urls"]["google"]))
    out = client.models.generate_content(
        model="gemini-x", contents="hello g", config=gt.GenerateContentConfig(system_instruction="sys", temperature=0.3)
    )
    assert out.text == "Hello! You said: hello g"
    rec = gw.sink.events[-1]
    assert decode(rec.completion_token_ids) == out.text
    assert rec.completion_logprobs == [logprob(i) for i in range(len(rec.completion_token_ids))]
    assert "temperature:0.3->1.0" in rec.gateway_changes and rec.sampling["temperature"] == 1.0
    chunks = list(client.models.generate_content_stream(model="gemini-x", contents="stream g"))
    text = "".join(c.text or "" for c in chunks)
    assert text == decode(gw.sink.events[-1].completion_token_ids) == "Hello! You said: stream g"
    assert chunks[-1].candidates[0].finish_reason == gt.FinishReason.STOP


def test_google_count_tokens_is_the_prompt_the_same_request_gets(gw) -> None:
    creds = gw.session()
    client = genai.Client(api_key=creds["token"], http_options=gt.HttpOptions(base_url=creds["base_urls"]["google"]))
    counted = client.models.count_tokens(model="gemini-x", contents="count me, please")
    assert gw.sink.events == [], "counting is not a model call"
    client.models.generate_content(model="gemini-x", contents="count me, please")
    assert counted.total_tokens == gw.sink.events[-1].prompt_len > 0


def test_google_function_call_round_trip(gw) -> None:
    creds = gw.session()
    client = genai.Client(api_key=creds["token"], http_options=gt.HttpOptions(base_url=creds["base_urls"]["google"]))
    tool = gt.Tool(
        function_declarations=[
            gt.FunctionDeclaration(name="get_weather", description="w", parameters_json_schema={"type": "object"})
        ]
    )
    cfg = gt.GenerateContentConfig(
        tools=[tool], automatic_function_calling=gt.AutomaticFunctionCallingConfig(disable=True)
    )
    out = client.models.generate_content(model="m", contents="CALL_TOOL", config=cfg)
    [fc] = out.function_calls
    assert fc.name == "get_weather" and fc.args == {"city": "Paris"}
    contents = [
        gt.Content(role="user", parts=[gt.Part(text="CALL_TOOL")]),
        out.candidates[0].content,
        gt.Content(
            role="user",
            parts=[
                gt.Part(
                    function_response=gt.FunctionResponse(id=fc.id, name="get_weather", response={"output": "hail"})
                )
            ],
        ),
    ]
    out2 = client.models.generate_content(model="m", contents=contents, config=cfg)
    assert out2.text == "The tool said: hail"
