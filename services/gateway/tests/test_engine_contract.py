"""One engine contract, two engines: the gateway in front of the CPU engine and of real vLLM, both serving the real
SmolLM2-135M-Instruct, spoken to with the vendors' SDKs.

``engine`` is ``cpu`` (``inference.create_app`` in process, ``max_model_len`` 2048 like vLLM's CPU profile) or
``vllm`` (the test session's one server, ``inference.testing.vllm_server``). Between the gateway and the engine sits
``EngineTap``, a pass-through proxy that keeps the engine's raw answers (not a fake: every byte is the engine's), so
each call is checked against what the engine itself sent:

- the recorded prompt ids (delta-decoded) are the ids the engine reports it consumed; the recorded completion ids
  and logprobs are exactly the ids and logprobs it streamed;
- the client's text is the real tokenizer's decoding of the recorded completion ids (tool-call blocks removed by
  the gateway's own parser; cut before a stop string), its tool calls are the ones written in those ids;
- in canonical mode the prompt ids are what ``transformers`` renders with the checkpoint's chat template for the
  messages the gateway sent, on both engines.

Covered: the four provider APIs, streaming and not; a tool-call turn (engine-parsed in canonical mode, gateway-parsed
in exact mode: a two-shot prompt makes SmolLM2 call ``ls`` under greedy decoding on both engines); exact mode (the
second call's prompt is the first's prompt + sampled ids + the tool result); context overflow (prompt over the
context -> each provider's context-length error, from either engine's own refusal too; prompt + max_tokens over the
context -> clamped by the gateway, where vLLM alone would cap and the CPU engine alone would refuse). Not covered
here: weight versions (raw vLLM reports none; ``inference.testing``'s reload tests and the version proxy own that).

Lean by design (one vLLM shared by the session, ~8 tokens/s decode on CPU): greedy, ``max_tokens`` 8, 32 for a
tool call (24 tokens), ~12 generations per engine.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from google import genai
from google.genai import types as gt

from contracts import ModelCallRecorded, TokenizationMode, decode_prompts, decode_requests
from gateway import GatewaySettings, create_app
from gateway.canonical import TextDelta, ToolCallDelta
from gateway.errors import ContextOverflow
from gateway.output_parser import OutputParser
from gateway.upstream import EngineClient, EngineToolCalls

from ._fakes import MemorySink, free_port, serve
from .conftest import CONTROL

MAX_MODEL_LEN = 2048  # deploy/vllm/serve.sh's CPU default; the CPU engine is started with the same
GENERATION_PATHS = ("/v1/chat/completions", "/v1/completions")
# The session's policy overrides every client's sampling (and the Anthropic SDK has no temperature any more).
GREEDY = {"temperature": 0.0, "top_p": 1.0}
SAY_HI = "Say hi."
OVERLONG = "hi " * 2100  # 2131 prompt tokens with the template: over the context before any output

TOOLS = [
    {
        "type": "function",
        "function": {"name": "ls", "description": "List files.", "parameters": {"type": "object", "properties": {}}},
    }
]


def _ls_call(i: int) -> dict[str, Any]:
    call = {"id": f"call_{i}", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


# Two earlier calls of the same tool: SmolLM2 copies the pattern (zero-shot it answers in prose on both engines).
TWO_SHOT = [
    {"role": "system", "content": "Call ls."},
    {"role": "user", "content": "ls"},
    _ls_call(1),
    {"role": "user", "content": "ls"},
    _ls_call(2),
    {"role": "user", "content": "ls"},
]


# ----------------------------------------------------------------------------------------------- the engine tap


@dataclass
class Exchange:
    path: str
    request: Any
    status: int = 0
    raw: bytearray = field(default_factory=bytearray)

    def chunks(self) -> list[dict[str, Any]]:
        """The answer's SSE events, or the whole answer as one (the gateway asks for it when its client does not
        stream); both carry the same fields (``delta`` or ``message``)."""
        if not (self.request or {}).get("stream"):
            return [json.loads(bytes(self.raw))]
        lines = bytes(self.raw).decode().splitlines()
        return [json.loads(ln[5:]) for ln in lines if ln.startswith("data:") and ln[5:].strip() != "[DONE]"]


@dataclass
class EngineAnswer:
    """What the engine answered, read straight off its SSE or JSON body (independently of the gateway's parser)."""

    prompt_ids: list[int]
    ids: list[int]
    logprobs: list[float]
    finish_reason: str | None


def engine_answer(ex: Exchange) -> EngineAnswer:
    prompt: list[int] = []
    ids: list[int] = []
    lps: list[float] = []
    finish = None
    for chunk in ex.chunks():
        prompt = chunk.get("prompt_token_ids") or prompt
        for c in chunk.get("choices") or []:
            prompt = c.get("prompt_token_ids") or prompt
            ids += c.get("token_ids") or []
            lp = c.get("logprobs") or {}
            lps += [e["logprob"] for e in lp["content"]] if "content" in lp else lp.get("token_logprobs") or []
            finish = c.get("finish_reason") or finish
    return EngineAnswer(prompt, ids, lps, finish)


class EngineTap:
    """Forwards every request to the engine and keeps the exchange (request body, status, raw response bytes)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.url = ""  # where the tap listens, once served
        self.exchanges: list[Exchange] = []
        self.app = FastAPI()
        self.app.add_api_route("/{path:path}", self._forward, methods=["GET", "POST"])

    def generations(self) -> list[Exchange]:
        return [e for e in self.exchanges if e.path in GENERATION_PATHS]

    async def _forward(self, request: Request, path: str) -> StreamingResponse:
        body = await request.body()
        ex = Exchange("/" + path, json.loads(body) if body else None)
        self.exchanges.append(ex)
        client = httpx.AsyncClient(timeout=300)
        upstream = client.build_request(
            request.method, f"{self.upstream}/{path}", content=body, headers={"content-type": "application/json"}
        )
        resp = await client.send(upstream, stream=True)
        ex.status = resp.status_code

        async def relay() -> Any:
            try:
                async for part in resp.aiter_bytes():
                    ex.raw += part
                    yield part
            finally:
                await resp.aclose()
                await client.aclose()

        keep = {k: v for k, v in resp.headers.items() if k in ("content-type", "x-floe-weight-version")}
        return StreamingResponse(relay(), status_code=resp.status_code, headers=keep)


# ----------------------------------------------------------------------------------------------- fixtures


@dataclass
class Engine:
    name: str
    url: str


@pytest.fixture(
    scope="module",
    params=[
        pytest.param("cpu", marks=pytest.mark.slow),
        pytest.param("vllm", marks=[pytest.mark.vllm, pytest.mark.slow]),
    ],
)
def engine(request: pytest.FixtureRequest, real_model_dir: Path) -> Iterator[Engine]:
    if request.param == "vllm":
        yield Engine("vllm", request.getfixturevalue("vllm_server").base_url)
        return
    from inference import create_app as create_engine
    from inference.settings import InferenceSettings

    settings = InferenceSettings(
        model_dir=real_model_dir,
        consume_weights=False,
        init_if_missing=False,
        threads=1,
        seed=1,
        max_model_len=MAX_MODEL_LEN,
    )
    with serve(create_engine(settings)) as url:
        yield Engine("cpu", url)


@pytest.fixture(scope="module")
def tokenizer(real_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(real_model_dir))


@pytest.fixture(scope="module")
def tap(engine: Engine) -> Iterator[EngineTap]:
    t = EngineTap(engine.url)
    with serve(t.app) as t.url:
        yield t


@dataclass
class Stack:
    url: str
    sink: MemorySink
    tap: EngineTap
    engine: Engine

    def creds(self, session_id: str, mode: TokenizationMode = TokenizationMode.CANONICAL) -> dict[str, Any]:
        r = httpx.post(
            self.url + "/admin/sessions",
            json={"session_id": session_id, "tokenization": mode.value, "model": "policy", "sampling": GREEDY},
            headers={"authorization": f"Bearer {CONTROL}"},
        )
        r.raise_for_status()
        return dict(r.json())

    def records(self) -> list[ModelCallRecorded]:
        return [e for e in self.sink.events if isinstance(e, ModelCallRecorded)]


@pytest.fixture
def stack(tap: EngineTap, engine: Engine) -> Iterator[Stack]:
    tap.exchanges.clear()
    sink = MemorySink()
    port = free_port()
    settings = GatewaySettings(
        engine_urls=[tap.url],
        control_token=CONTROL,
        public_url=f"http://127.0.0.1:{port}",
        default_max_tokens=8,
    )
    with serve(create_app(settings, sink=sink), port) as url:
        yield Stack(url, sink, tap, engine)


def _openai(creds: dict[str, Any]) -> openai.OpenAI:
    return openai.OpenAI(base_url=creds["base_urls"]["openai"], api_key=creds["token"], max_retries=0, timeout=300)


def _anthropic(creds: dict[str, Any]) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=creds["base_urls"]["anthropic"], api_key=creds["token"], max_retries=0, timeout=300
    )


def _google(creds: dict[str, Any]) -> genai.Client:
    opts = gt.HttpOptions(base_url=creds["base_urls"]["google"], timeout=300_000)
    return genai.Client(api_key=creds["token"], http_options=opts)


# ----------------------------------------------------------------------------------------------- the checks


def full_prompts(recs: list[ModelCallRecorded]) -> list[list[int]]:
    """The full prompt of each record (delta encoding undone per session, which is how it is encoded)."""
    by_session: dict[str, list[ModelCallRecorded]] = {}
    for r in recs:
        by_session.setdefault(r.session_id, []).append(r)
    decoded = {
        (r.session_id, r.call_index): list(p)
        for calls in by_session.values()
        for r, p in zip(calls, decode_prompts(calls), strict=True)
    }
    return [decoded[(r.session_id, r.call_index)] for r in recs]


def full_requests(recs: list[ModelCallRecorded]) -> list[dict[str, Any]]:
    """The full canonical request of each record (request delta encoding undone per session)."""
    by_session: dict[str, list[ModelCallRecorded]] = {}
    for r in recs:
        by_session.setdefault(r.session_id, []).append(r)
    decoded = {
        (r.session_id, r.call_index): q
        for calls in by_session.values()
        for r, q in zip(calls, decode_requests(calls), strict=True)
    }
    return [decoded[(r.session_id, r.call_index)] for r in recs]


def render_chat(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
    """The prompt ids ``transformers`` makes with the checkpoint's chat template (the template has the special
    tokens, so none are added)."""
    text = tokenizer.apply_chat_template(messages, tools=tools or None, add_generation_prompt=True, tokenize=False)
    return list(tokenizer.encode(text, add_special_tokens=False))


@dataclass
class Visible:
    text: str
    calls: list[tuple[str, Any]]  # (name, arguments object)


def visible(tokenizer: Any, ids: list[int], stop: tuple[str, ...] = ()) -> Visible:
    """What a client must see for these sampled ids: their decoding (the end-of-turn token is special, so not shown),
    cut before the first stop string, read by the gateway's Hermes parser."""
    text = tokenizer.decode(ids, skip_special_tokens=True)
    cuts = [i for i in (text.find(s) for s in stop) if i >= 0]
    text = text[: min(cuts)] if cuts else text
    p = OutputParser()
    events = p.feed(text) + p.finish()
    return Visible(
        "".join(e.text for e in events if isinstance(e, TextDelta)),
        [(e.call.name, e.call.arguments_obj()) for e in events if isinstance(e, ToolCallDelta)],
    )


def check_calls(
    stack: Stack,
    tokenizer: Any,
    seen: list[str],
    *,
    stop: tuple[str, ...] = (),
) -> list[tuple[ModelCallRecorded, Visible]]:
    """Each recorded call against the engine's own answer and the text the client got (``seen``, in call order)."""
    recs = stack.records()
    gens = stack.tap.generations()
    assert len(recs) == len(gens) == len(seen), (len(recs), len(gens), len(seen))
    fulls = full_prompts(recs)
    requests = full_requests(recs)
    out = []
    for rec, full, req, ex, client_text in zip(recs, fulls, requests, gens, seen, strict=True):
        assert ex.status == 200, bytes(ex.raw)[:500]
        ans = engine_answer(ex)
        assert full == ans.prompt_ids, f"call {rec.call_index}: recorded prompt is not what the engine consumed"
        assert rec.completion_token_ids == ans.ids, rec.call_index
        assert rec.completion_logprobs == ans.logprobs, rec.call_index  # exactly the engine's floats
        assert len(ans.ids) >= 1 and all(lp <= 0.0 for lp in ans.logprobs)
        assert (rec.finish_reason == "length") == (ans.finish_reason == "length"), (rec.finish_reason, ans)
        if rec.tokenization is TokenizationMode.EXACT:
            assert ex.request["prompt"] == full, "exact mode: the ids sent are the ids recorded"
        else:
            assert full == render_chat(tokenizer, req["messages"], req["tools"]), (
                f"call {rec.call_index}: {stack.engine.name} rendered the chat template differently from transformers"
            )
        v = visible(tokenizer, rec.completion_token_ids, stop)
        assert client_text == v.text, (rec.call_index, rec.protocol.value)
        out.append((rec, v))
    return out


# ----------------------------------------------------------------------------------------------- the suite


def test_every_provider_api_streaming_and_not(stack: Stack, tokenizer: Any) -> None:
    creds = stack.creds("contract-apis")
    seen: list[str] = []
    usage: list[tuple[int, int]] = []  # (prompt, completion) tokens the client was told, non-streaming calls
    msgs = [{"role": "user", "content": SAY_HI}]

    oa = _openai(creds)
    out = oa.chat.completions.create(model="policy", messages=msgs, max_tokens=8)
    seen.append(out.choices[0].message.content or "")
    assert out.usage is not None
    usage.append((out.usage.prompt_tokens, out.usage.completion_tokens))
    chunks = oa.chat.completions.create(model="policy", messages=msgs, max_tokens=8, stream=True)
    seen.append("".join(c.choices[0].delta.content or "" for c in chunks if c.choices))

    r = oa.responses.create(model="policy", input=SAY_HI, max_output_tokens=8)
    seen.append(r.output_text)
    assert r.usage is not None
    usage.append((r.usage.input_tokens, r.usage.output_tokens))
    text = ""
    for ev in oa.responses.create(model="policy", input=SAY_HI, max_output_tokens=8, stream=True):
        if ev.type == "response.output_text.delta":
            text += ev.delta
    seen.append(text)

    an = _anthropic(creds)
    m = an.messages.create(model="policy", max_tokens=8, messages=msgs)
    seen.append("".join(b.text for b in m.content if b.type == "text"))
    usage.append((m.usage.input_tokens, m.usage.output_tokens))
    with an.messages.stream(model="policy", max_tokens=8, messages=msgs) as s:
        seen.append("".join(s.text_stream))

    g = _google(creds)
    cfg = gt.GenerateContentConfig(max_output_tokens=8)
    gr = g.models.generate_content(model="policy", contents=SAY_HI, config=cfg)
    seen.append(gr.text or "")
    assert gr.usage_metadata is not None
    usage.append((gr.usage_metadata.prompt_token_count or 0, gr.usage_metadata.candidates_token_count or 0))
    seen.append(
        "".join(c.text or "" for c in g.models.generate_content_stream(model="policy", contents=SAY_HI, config=cfg))
    )

    checked = check_calls(stack, tokenizer, seen)
    recs = [rec for rec, _ in checked]
    assert [r.protocol.value for r in recs] == [
        p for p in ("openai_chat", "openai_responses", "anthropic_messages", "google_generate") for _ in (0, 1)
    ]
    fulls = full_prompts(recs)
    assert usage == [(len(fulls[i]), len(recs[i].completion_token_ids)) for i in (0, 2, 4, 6)]
    # The same conversation, greedy: one prompt, one answer, whichever API carried it.
    assert all(f == fulls[0] for f in fulls)
    assert all(r.completion_token_ids == recs[0].completion_token_ids for r in recs)
    assert all(r.finish_reason == "length" for r in recs)


def test_tool_call_turn_canonical_and_exact(stack: Stack, tokenizer: Any) -> None:
    # Canonical mode, streamed: the engine's own Hermes parser finds the call (vLLM streams it in fragments).
    oa = _openai(stack.creds("contract-tools"))
    content, calls, finish = "", {}, None
    for ch in oa.chat.completions.create(
        model="policy",
        messages=TWO_SHOT,
        tools=TOOLS,
        max_tokens=32,
        stream=True,
    ):
        if not ch.choices:
            continue
        content += ch.choices[0].delta.content or ""
        finish = ch.choices[0].finish_reason or finish
        for tc in ch.choices[0].delta.tool_calls or []:
            assert tc.function is not None
            name, args = calls.get(tc.index, ("", ""))
            calls[tc.index] = (name + (tc.function.name or ""), args + (tc.function.arguments or ""))
    assert finish == "tool_calls"
    streamed = [(name, json.loads(args)) for _, (name, args) in sorted(calls.items())]

    # Exact mode: the same turn as token ids (/v1/completions has no tool parser: the gateway parses), then the
    # tool result, whose prompt must extend the first call's prompt + sampled ids.
    ex = _openai(stack.creds("contract-tools-exact", TokenizationMode.EXACT))
    first = ex.chat.completions.create(model="policy", messages=TWO_SHOT, tools=TOOLS, max_tokens=32)
    msg = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls" and msg.tool_calls
    call = msg.tool_calls[0]
    history = [
        *TWO_SHOT,
        {"role": "assistant", "content": msg.content, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "a.py"},
    ]
    second = ex.chat.completions.create(model="policy", messages=history, tools=TOOLS, max_tokens=8)

    seen = [content, msg.content or "", second.choices[0].message.content or ""]
    checked = check_calls(stack, tokenizer, seen)
    (canon, v_canon), (exact1, v_exact1), (exact2, _) = checked
    assert v_canon.calls == streamed == [("ls", {})], (stack.engine.name, v_canon, streamed)
    # The streamed call asked for chunks of `engine_stream_interval` tokens (the first at once), and got them: the
    # call above was parsed across multi-token deltas, and check_calls found every sampled id and logprob recorded.
    interval = GatewaySettings.model_fields["engine_stream_interval"].default
    asked = stack.tap.generations()[0]
    assert asked.request["stream"] and asked.request["stream_interval"] == interval
    sizes = [n for c in asked.chunks() for ch in c.get("choices") or [] if (n := len(ch.get("token_ids") or []))]
    assert sizes[0] == 1 and 1 < max(sizes) <= interval, sizes
    assert v_exact1.calls == [(call.function.name, json.loads(call.function.arguments))] == [("ls", {})]
    assert canon.finish_reason == exact1.finish_reason == "tool_calls"
    # One template, one greedy model: both modes saw the same prompt and sampled the same call.
    fulls = full_prompts([canon, exact1, exact2])
    assert fulls[0] == fulls[1] and canon.completion_token_ids == exact1.completion_token_ids
    assert fulls[2][: len(fulls[1]) + len(exact1.completion_token_ids)] == fulls[1] + exact1.completion_token_ids
    assert exact2.prefix_call_index == exact1.call_index
    assert not any(c.startswith("exact:new_chain") for c in exact2.gateway_changes), exact2.gateway_changes


def test_max_tokens_over_the_context_is_clamped_by_the_gateway(stack: Stack, tokenizer: Any) -> None:
    """Prompt + max_tokens over the context: vLLM alone would cap the output, the CPU engine alone would refuse
    (400 context_length_exceeded); the gateway clamps max_tokens to the room left, so both answer the same."""
    oa = _openai(stack.creds("contract-clamp"))
    stop = ("!", ".")
    out = oa.chat.completions.create(
        model="policy",
        messages=[{"role": "user", "content": SAY_HI}],
        max_tokens=4 * MAX_MODEL_LEN,
        stop=list(stop),
    )
    [(rec, _)] = check_calls(stack, tokenizer, [out.choices[0].message.content or ""], stop=stop)
    room = MAX_MODEL_LEN - rec.prompt_len
    assert rec.sampling["max_tokens"] == room
    assert f"max_tokens:{4 * MAX_MODEL_LEN}->{room}:context" in rec.gateway_changes
    assert stack.tap.generations()[0].request["max_tokens"] == room
    assert rec.finish_reason == "stop_sequence"


def test_prompt_over_the_context_is_each_providers_context_error(stack: Stack, tokenizer: Any) -> None:
    n = len(render_chat(tokenizer, [{"role": "user", "content": OVERLONG}], None))
    assert n > MAX_MODEL_LEN
    creds = stack.creds("contract-overflow")
    msgs = [{"role": "user", "content": OVERLONG}]
    oa = _openai(creds)
    with pytest.raises(openai.BadRequestError) as chat_err:
        oa.chat.completions.create(model="policy", messages=msgs, max_tokens=8)
    body = chat_err.value.body
    assert isinstance(body, dict) and body["code"] == "context_length_exceeded"
    assert f"maximum context length is {MAX_MODEL_LEN} tokens" in body["message"] and str(n) in body["message"]
    with pytest.raises(openai.BadRequestError) as resp_err:
        oa.responses.create(model="policy", input=OVERLONG, max_output_tokens=8)
    assert isinstance(resp_err.value.body, dict) and resp_err.value.body["code"] == "context_length_exceeded"
    an = _anthropic(creds)
    for streaming in (False, True):
        with pytest.raises(anthropic.BadRequestError) as an_err:
            if streaming:
                with an.messages.stream(model="policy", max_tokens=8, messages=msgs) as s:
                    s.get_final_message()
            else:
                an.messages.create(model="policy", max_tokens=8, messages=msgs)
        assert "prompt is too long" in an_err.value.message  # Claude Code compacts on exactly this
    g = _google(creds)  # held: a client that is garbage-collected closes its transport mid-call
    with pytest.raises(genai.errors.ClientError) as g_err:
        g.models.generate_content(model="policy", contents=OVERLONG)
    assert g_err.value.code == 400 and "exceeds the maximum number of tokens" in str(g_err.value.message)
    # Exact mode finds it while planning the prompt ids.
    with pytest.raises(openai.BadRequestError) as exact_err:
        _openai(stack.creds("contract-overflow-exact", TokenizationMode.EXACT)).chat.completions.create(
            model="policy",
            messages=msgs,
            max_tokens=8,
        )
    assert isinstance(exact_err.value.body, dict) and exact_err.value.body["code"] == "context_length_exceeded"
    # The gateway refuses before generating: nothing recorded, no generation request reached the engine.
    assert stack.records() == [] and stack.tap.generations() == []


async def test_the_engines_own_overflow_refusal_maps_to_context_overflow(engine: Engine) -> None:
    """Should a prompt reach the engine anyway, its own refusal (different bodies: vLLM's ``BadRequestError`` with
    ``param: input_tokens``, ours ``context_length_exceeded``) becomes the same ``ContextOverflow``."""
    client = EngineClient([engine.url], model="policy", timeout_s=60, connect_timeout_s=5, unhealthy_s=1)
    try:
        bodies = [
            ("/v1/completions", {"model": "policy", "prompt": [28] * (MAX_MODEL_LEN + 50), "max_tokens": 4}),
            ("/v1/chat/completions", {"model": "policy", "messages": [{"role": "user", "content": OVERLONG}]}),
        ]
        for path, body in bodies:
            with pytest.raises(ContextOverflow) as err:
                async for _ in client.stream("s", path, body, prompt_len=MAX_MODEL_LEN + 50):
                    pass
            assert err.value.max_model_len == MAX_MODEL_LEN, (engine.name, path, err.value.message)
    finally:
        await client.aclose()


def test_engine_tool_call_fragments_assemble_into_whole_calls() -> None:
    """vLLM's streamed Hermes call (as served here: id and name first, arguments later, the EOS chunk last) and
    the CPU engine's whole call make the same ``ToolCall``; a later index or following text closes a call."""
    vllm = EngineToolCalls()
    assert vllm.feed([{"id": "chatcmpl-tool-1", "type": "function", "index": 0, "function": {"name": "ls"}}], "") == []
    assert vllm.feed([{"index": 0, "function": {"arguments": '{"pa'}}], "") == []
    assert vllm.feed([{"index": 0, "function": {"arguments": 'th": "."}'}}], "") == []
    [call] = vllm.finish()
    assert (call.id, call.name, call.arguments) == ("chatcmpl-tool-1", "ls", '{"path": "."}')
    cpu = EngineToolCalls()
    whole = {"index": 0, "id": "c", "type": "function", "function": {"name": "ls", "arguments": '{"path": "."}'}}
    assert cpu.feed([whole], "") == []
    [first] = cpu.feed([{**whole, "index": 1, "id": "d"}], "")
    assert (first.id, first.arguments) == ("c", '{"path": "."}')
    [second] = cpu.feed([], "then text")
    assert second.id == "d" and cpu.finish() == []
