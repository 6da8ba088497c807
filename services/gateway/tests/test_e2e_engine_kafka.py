"""End to end: vendor SDKs -> real gateway -> real floe CPU engine (``inference``), records on the real broker.

For every protocol, streaming and not: the text the client receives equals the (parsed) detokenized completion
ids of the Kafka record, and the record's logprobs equal the engine's own logprobs for those ids. Tool definitions,
tool calls and tool results travel in the requests; the engine's weights are random, so whether it *answers* with a
tool call is chance — answering with tool calls is covered against the scripted fake engine in the other tests.
Exact mode: over a multi-turn conversation (with tool calls and results in its history) every record's prompt
starts with the previous record's prompt + completion ids.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from google import genai
from google.genai import types as gt

from contracts import MODEL_CALLS, ModelCallRecorded, TokenizationMode
from eventbus import Consumer
from gateway import GatewaySettings, create_app
from gateway.canonical import TextDelta
from gateway.output_parser import OutputParser

from ._fakes import free_port, serve
from .conftest import CONTROL
from .test_exact_mode import full_prompts

pytestmark = pytest.mark.integration

TOOLS_OA = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
HISTORY_OA = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
]


@pytest.fixture(scope="module")
def engine_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from inference import create_app as create_engine
    from inference.settings import InferenceSettings

    model_dir: Path = tmp_path_factory.mktemp("engine") / "model"
    settings = InferenceSettings(model_dir=model_dir, consume_weights=False, threads=1, seed=1234)
    with serve(create_engine(settings)) as url:
        yield url


@pytest.fixture
def stack(engine_url, kafka_settings, topic_factory):
    topic = topic_factory(MODEL_CALLS)
    port = free_port()
    settings = GatewaySettings(
        engine_urls=[engine_url],
        control_token=CONTROL,
        public_url=f"http://127.0.0.1:{port}",
        model_calls_topic=topic.name,
        default_max_tokens=12,
    )
    with serve(create_app(settings, kafka=kafka_settings), port) as url:
        yield url, topic


def _session(url: str, sid: str, mode: TokenizationMode) -> dict:
    r = httpx.post(
        url + "/admin/sessions",
        json={"session_id": sid, "tokenization": mode.value, "model": "policy"},
        headers={"authorization": f"Bearer {CONTROL}"},
    )
    r.raise_for_status()
    return r.json()


async def _records(kafka_settings, topic, group: str, n: int) -> list[ModelCallRecorded]:
    out: list[ModelCallRecorded] = []

    async def collect() -> None:
        async with Consumer(kafka_settings, [topic], group_id=group) as consumer:
            async for msg in consumer:
                out.append(msg.event)
                if len(out) >= n:
                    return

    await asyncio.wait_for(collect(), 60)
    return sorted(out, key=lambda r: r.call_index)


def _visible(engine_url: str, ids: list[int]) -> str:
    text = httpx.post(engine_url + "/detokenize", json={"tokens": ids}).json()["prompt"]
    for eos in ("<|im_end|>", "<|endoftext|>"):  # a sampled end-of-turn token is recorded, never shown as text
        text = text.removesuffix(eos)
    p = OutputParser()
    evs = p.feed(text) + p.finish()
    return "".join(e.text for e in evs if isinstance(e, TextDelta))


async def test_every_protocol_text_equals_record(stack, engine_url, kafka_settings, consumer_group) -> None:
    url, topic = stack
    creds = _session(url, "e2e-canon", TokenizationMode.CANONICAL)
    tok = creds["token"]
    seen: list[str] = []
    oa = openai.OpenAI(base_url=creds["base_urls"]["openai"], api_key=tok, max_retries=0)
    out = oa.chat.completions.create(model="policy", messages=HISTORY_OA, tools=TOOLS_OA, max_tokens=12, seed=1)
    seen.append(out.choices[0].message.content or "")
    st = oa.chat.completions.create(model="policy", messages=HISTORY_OA, tools=TOOLS_OA, max_tokens=12, stream=True)
    seen.append("".join((c.choices[0].delta.content or "") for c in st if c.choices))
    r = oa.responses.create(
        model="policy",
        input=[
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "rain"},
        ],
        tools=[{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
        max_output_tokens=12,
    )
    seen.append(r.output_text)
    text = ""
    for ev in oa.responses.create(model="policy", input="hello", max_output_tokens=12, stream=True):
        if ev.type == "response.output_text.delta":
            text += ev.delta
    seen.append(text)
    an = anthropic.Anthropic(base_url=creds["base_urls"]["anthropic"], api_key=tok, max_retries=0)
    atools = [{"name": "get_weather", "description": "w", "input_schema": {"type": "object"}}]
    amsgs = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]},
    ]
    m = an.messages.create(model="policy", max_tokens=12, messages=amsgs, tools=atools)
    seen.append("".join(b.text for b in m.content if b.type == "text"))
    with an.messages.stream(model="policy", max_tokens=12, messages=amsgs, tools=atools) as s:
        seen.append("".join(s.text_stream))
    g = genai.Client(api_key=tok, http_options=gt.HttpOptions(base_url=creds["base_urls"]["google"]))
    cfg = gt.GenerateContentConfig(max_output_tokens=12)
    seen.append(g.models.generate_content(model="policy", contents="hi", config=cfg).text or "")
    seen.append(
        "".join(c.text or "" for c in g.models.generate_content_stream(model="policy", contents="hi", config=cfg))
    )

    recs = await _records(kafka_settings, topic, consumer_group, len(seen))
    assert [r.call_index for r in recs] == list(range(len(seen)))
    assert [r.protocol.value for r in recs] == ["openai_chat"] * 2 + ["openai_responses"] * 2 + [
        "anthropic_messages"
    ] * 2 + ["google_generate"] * 2
    for rec, client_text in zip(recs, seen, strict=True):
        assert rec.session_id == "e2e-canon" and rec.tokenization is TokenizationMode.CANONICAL
        assert len(rec.completion_token_ids) == len(rec.completion_logprobs) > 0
        assert all(lp <= 0.0 for lp in rec.completion_logprobs)
        assert client_text == _visible(engine_url, rec.completion_token_ids), rec.call_index
        assert rec.timings.ttft_ms > 0 and rec.timings.total_ms >= rec.timings.ttft_ms


async def test_logprobs_in_record_equal_the_engines(stack, engine_url, kafka_settings, consumer_group) -> None:
    """The engine streams (id, logprob) pairs; the record must hold exactly those — compare with a direct call to
    the engine using the same seed (the CPU engine is deterministic for a seeded request)."""
    url, topic = stack
    creds = _session(url, "e2e-lp", TokenizationMode.CANONICAL)
    msgs = [{"role": "user", "content": "count to three"}]
    oa = openai.OpenAI(base_url=creds["base_urls"]["openai"], api_key=creds["token"], max_retries=0)
    oa.chat.completions.create(model="policy", messages=msgs, max_tokens=8, seed=7)
    direct = httpx.post(
        engine_url + "/v1/chat/completions",
        json={
            "model": "policy",
            "messages": msgs,
            "max_tokens": 8,
            "seed": 7,
            "temperature": 1.0,
            "top_p": 1.0,
            "logprobs": True,
            "return_token_ids": True,
        },
    ).json()
    [rec] = await _records(kafka_settings, topic, consumer_group, 1)
    assert rec.sampling["seed"] == 7
    assert rec.completion_token_ids == direct["choices"][0]["token_ids"]
    assert rec.completion_logprobs == pytest.approx(
        [e["logprob"] for e in direct["choices"][0]["logprobs"]["content"]], abs=1e-5
    )
    assert rec.prompt_token_ids == direct["prompt_token_ids"]


async def test_exact_mode_multi_turn_chain(stack, engine_url, kafka_settings, consumer_group) -> None:
    url, topic = stack
    creds = _session(url, "e2e-exact", TokenizationMode.EXACT)
    oa = openai.OpenAI(base_url=creds["base_urls"]["openai"], api_key=creds["token"], max_retries=0)
    an = anthropic.Anthropic(base_url=creds["base_urls"]["anthropic"], api_key=creds["token"], max_retries=0)
    msgs = list(HISTORY_OA)
    for turn in range(3):
        out = oa.chat.completions.create(model="policy", messages=msgs, tools=TOOLS_OA, max_tokens=10, stream=turn == 1)
        if turn == 1:
            content = "".join((c.choices[0].delta.content or "") for c in out if c.choices)
        else:
            content = out.choices[0].message.content or ""
        msgs += [{"role": "assistant", "content": content}, {"role": "user", "content": f"and turn {turn}?"}]
    recs = await _records(kafka_settings, topic, consumer_group, 3)
    fulls = full_prompts(recs)
    for i in (1, 2):
        seq = fulls[i - 1] + recs[i - 1].completion_token_ids
        assert fulls[i][: len(seq)] == seq, f"turn {i} re-tokenized earlier tokens"
        assert recs[i].prefix_call_index == i - 1 and recs[i].prefix_len == len(seq)
        assert not any(c.startswith("exact:new_chain") for c in recs[i].gateway_changes), recs[i].gateway_changes
    # an anthropic side call in the same session starts its own chain and does not break the main one
    an.messages.create(model="policy", max_tokens=5, messages=[{"role": "user", "content": "title?"}])
    msgs += [{"role": "assistant", "content": "ok"}]  # not what the model said: the next call must start a new chain
    out = oa.chat.completions.create(model="policy", messages=[*msgs, {"role": "user", "content": "x"}], max_tokens=4)
    recs = await _records(kafka_settings, topic, consumer_group + "-2", 5)
    assert recs[3].protocol.value == "anthropic_messages"
    assert any(c.startswith("exact:new_chain") for c in recs[4].gateway_changes)
    assert recs[4].prefix_call_index == 2  # still delta-encoded against the longest shared prefix
    assert out.choices[0].message is not None
