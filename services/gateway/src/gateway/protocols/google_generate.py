"""Google Gemini API (``POST /v1beta/models/{model}:generateContent`` and ``:streamGenerateContent``).

Quirks handled (docs/harnesses.md, "Gemini CLI"): tools declared with ``parametersJsonSchema`` or ``parameters``;
client-made function-call ids, replayed ``thoughtSignature`` (ignored); ``thought: true`` parts are reasoning;
``functionResponse.response`` objects become the tool message's JSON text (a bare ``output`` string is used as is).
Non-function tools (``googleSearch``, ``codeExecution``) are dropped; ``inlineData``/``fileData`` refused with a 400.
The router side call (``responseJsonSchema`` on a ``*flash-lite*`` model) is classified.

Streaming: with ``alt=sse`` each chunk is one ``data:`` event; without it, a JSON array streamed element by
element. The chunk with ``finishReason`` and ``usageMetadata`` is sent after the record is durable.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from contracts import Protocol
from gateway.canonical import (
    CanonicalRequest,
    Message,
    ReasoningDelta,
    TextDelta,
    Tool,
    ToolCall,
    ToolCallDelta,
    TurnResult,
)
from gateway.core import Turn
from gateway.errors import ErrorBody, GatewayError, InvalidRequest, UnsupportedContent
from gateway.protocols.sse import sse

__all__ = ["PROTOCOL", "CountTokensRequest", "GenerateRequest", "render_json", "stream", "to_canonical"]

PROTOCOL = Protocol.GOOGLE_GENERATE
_FINISH = {"stop": "STOP", "stop_sequence": "STOP", "tool_calls": "STOP", "length": "MAX_TOKENS"}


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow")


class Content(_Wire):
    role: Literal["user", "model", "function", "tool"] | None = None
    parts: list[dict[str, Any]] = Field(default_factory=list)


class GenerationConfig(_Wire):
    temperature: float | None = Field(default=None, ge=0, le=2)
    topP: float | None = Field(default=None, ge=0, le=1)
    topK: float | None = Field(default=None, ge=0)
    maxOutputTokens: int | None = Field(default=None, ge=1)
    stopSequences: list[str] | None = None
    candidateCount: int | None = Field(default=None, ge=1, le=1)
    seed: int | None = None
    thinkingConfig: dict[str, Any] | None = None


class GenerateRequest(_Wire):
    contents: list[Content] = Field(min_length=1)
    systemInstruction: Content | None = None
    tools: list[dict[str, Any]] | None = None
    toolConfig: dict[str, Any] | None = None
    generationConfig: GenerationConfig | None = None


class CountTokensRequest(_Wire):
    """``:countTokens`` body: bare ``contents`` (what the google-genai SDK sends to the Gemini API) or a whole
    ``generateContentRequest`` (system instruction and tools counted too)."""

    contents: list[Content] | None = None
    generateContentRequest: GenerateRequest | None = None

    def as_generate(self) -> GenerateRequest:
        if self.generateContentRequest is not None:
            return self.generateContentRequest
        if not self.contents:
            raise InvalidRequest("countTokens needs `contents` or `generateContentRequest`")
        return GenerateRequest(contents=self.contents)


def _part_text(p: dict[str, Any], where: str) -> str:
    if "text" in p:
        return str(p["text"])
    if "inlineData" in p or "fileData" in p:
        raise UnsupportedContent(f"{where}: media parts are not supported (text-only model)")
    raise InvalidRequest(f"{where}: unsupported part with keys {sorted(p)[:4]}")


def to_canonical(body: GenerateRequest, model: str, *, stream: bool) -> CanonicalRequest:
    msgs: list[Message] = []
    if body.systemInstruction is not None:
        msgs.append(
            Message("system", "".join(_part_text(p, "systemInstruction") for p in body.systemInstruction.parts))
        )
    for i, c in enumerate(body.contents):
        where = f"contents[{i}]"
        if c.role == "model":
            text, reasoning, calls = [], [], []
            for j, p in enumerate(c.parts):
                if "functionCall" in p:
                    fc = p["functionCall"]
                    if not isinstance(fc, dict) or not isinstance(fc.get("name"), str):
                        raise InvalidRequest(f"{where}.parts[{j}]: functionCall needs a name")
                    calls.append(
                        ToolCall(
                            str(fc.get("id") or f"{fc['name']}_{i}_{j}"),
                            fc["name"],
                            json.dumps(fc.get("args") or {}, ensure_ascii=False),
                        )
                    )
                elif p.get("thought"):
                    reasoning.append(_part_text(p, where))
                else:
                    text.append(_part_text(p, where))
            msgs.append(
                Message("assistant", "".join(text), reasoning="".join(reasoning) or None, tool_calls=tuple(calls))
            )
        else:
            texts: list[str] = []
            for j, p in enumerate(c.parts):
                if "functionResponse" in p:
                    fr = p["functionResponse"]
                    if not isinstance(fr, dict) or not isinstance(fr.get("name"), str):
                        raise InvalidRequest(f"{where}.parts[{j}]: functionResponse needs a name")
                    resp = fr.get("response")
                    out = (
                        resp["output"]
                        if isinstance(resp, dict) and set(resp) == {"output"} and isinstance(resp["output"], str)
                        else json.dumps(resp, ensure_ascii=False)
                    )
                    msgs.append(Message("tool", out, tool_call_id=str(fr.get("id") or fr["name"]), name=fr["name"]))
                else:
                    texts.append(_part_text(p, f"{where}.parts[{j}]"))
            if texts:
                msgs.append(Message("user", "".join(texts)))
    tools: list[Tool] = []
    for t in body.tools or []:
        for d in t.get("functionDeclarations") or t.get("function_declarations") or []:
            if not isinstance(d, dict) or not isinstance(d.get("name"), str):
                raise InvalidRequest("tools: a function declaration needs a name")
            params = d.get("parametersJsonSchema") or d.get("parameters") or {}
            tools.append(Tool(d["name"], str(d.get("description") or ""), params if isinstance(params, dict) else {}))
    g = body.generationConfig or GenerationConfig()
    sampling = {
        k: v
        for k, v in {
            "temperature": g.temperature,
            "top_p": g.topP,
            "top_k": int(g.topK) if g.topK is not None else None,
            "max_tokens": g.maxOutputTokens,
            "stop": g.stopSequences,
            "seed": g.seed,
        }.items()
        if v is not None
    }
    thinking = None
    if g.thinkingConfig is not None:
        thinking = bool(g.thinkingConfig.get("includeThoughts")) or bool(g.thinkingConfig.get("thinkingBudget"))
    gextra = g.model_extra or {}
    side = "router" if ("responseJsonSchema" in gextra or "responseSchema" in gextra) and "lite" in model else None
    return CanonicalRequest(
        model=model,
        messages=msgs,
        tools=tools,
        tool_choice=body.toolConfig,
        sampling=sampling,
        stream=stream,
        thinking=thinking,
        side_call=side,
    )


def _call_part(c: ToolCall) -> dict[str, Any]:
    args = c.arguments_obj()
    return {"functionCall": {"id": c.id, "name": c.name, "args": args if isinstance(args, dict) else {"input": args}}}


def _usage(r: TurnResult) -> dict[str, int]:
    return {
        "promptTokenCount": r.usage.prompt_tokens,
        "candidatesTokenCount": r.usage.completion_tokens,
        "totalTokenCount": r.usage.total_tokens,
    }


def _chunk(r: TurnResult, parts: list[dict[str, Any]], finish: bool) -> dict[str, Any]:
    cand: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    out: dict[str, Any] = {"candidates": [cand], "modelVersion": r.model, "responseId": r.call_id}
    if finish:
        cand["finishReason"] = _FINISH.get(r.finish_reason, "STOP")
        out["usageMetadata"] = _usage(r)
    return out


def render_json(r: TurnResult) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    if r.reasoning:
        parts.append({"text": r.reasoning, "thought": True})
    if r.text or not r.tool_calls:
        parts.append({"text": r.text})
    parts.extend(_call_part(c) for c in r.tool_calls)
    return _chunk(r, parts, finish=True)


async def stream(turn: Turn, sse_mode: bool, error_body: ErrorBody) -> AsyncIterator[bytes]:
    r = turn.result
    first = True

    def emit(obj: dict[str, Any]) -> bytes:
        nonlocal first
        if sse_mode:
            return sse(obj)
        head = b"[" if first else b",\n"
        first = False
        return head + json.dumps(obj, ensure_ascii=False).encode()

    try:
        async for e in turn.events():
            if isinstance(e, TextDelta):
                yield emit(_chunk(r, [{"text": e.text}], finish=False))
            elif isinstance(e, ReasoningDelta):
                yield emit(_chunk(r, [{"text": e.text, "thought": True}], finish=False))
            elif isinstance(e, ToolCallDelta):
                yield emit(_chunk(r, [_call_part(e.call)], finish=False))
    except GatewayError as err:
        yield emit(error_body(err))
        if not sse_mode:
            yield b"]"
        return
    yield emit(_chunk(r, [{"text": ""}], finish=True))
    if not sse_mode:
        yield b"]"
