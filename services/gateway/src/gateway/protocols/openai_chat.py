"""OpenAI Chat Completions (``POST /v1/chat/completions``): wire models, to/from canonical, SSE chunks.

Quirks handled (docs/harnesses.md, "OpenAI Chat quirks"): ``developer`` role (pi, Codex-style prompts) becomes system;
tool results as arrays of text parts (Qwen Code); assistant tool-call messages with ``content: null`` or no ``content``
key (mini-swe-agent); ``max_completion_tokens`` as well as ``max_tokens``; ``reasoning_content``/``reasoning`` on
assistant messages. Images and audio parts are refused with a 400 (the engine is text-only).
"""

from __future__ import annotations

import time
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
from gateway.protocols.sse import Lead, sse

__all__ = ["PROTOCOL", "ChatRequest", "render_json", "stream", "to_canonical"]

PROTOCOL = Protocol.OPENAI_CHAT
_FINISH = {"stop": "stop", "stop_sequence": "stop", "length": "length", "tool_calls": "tool_calls"}


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow")


class FunctionCall(_Wire):
    name: str
    arguments: str | dict[str, Any] = ""


class ToolCallWire(_Wire):
    id: str = ""
    type: str = "function"
    function: FunctionCall


class ChatMessage(_Wire):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCallWire] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None


class FunctionDef(_Wire):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolWire(_Wire):
    type: str = "function"
    function: FunctionDef | None = None


class StreamOptions(_Wire):
    include_usage: bool | None = None


class ChatRequest(_Wire):
    model: str = Field(min_length=1)
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ToolWire] | None = None
    tool_choice: str | dict[str, Any] | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: int | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int | None = Field(default=None, ge=1, le=1)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    reasoning_effort: str | None = None


def _text(content: str | list[dict[str, Any]] | None, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    out: list[str] = []
    for part in content:
        kind = part.get("type")
        if kind in ("text", "input_text", "output_text") and isinstance(part.get("text"), str):
            out.append(part["text"])
        elif kind in ("image_url", "input_image", "input_audio", "file", "image"):
            raise UnsupportedContent(
                f"{where}: content part type {kind!r} is not supported (text-only model)", param="messages"
            )
        else:
            raise InvalidRequest(f"{where}: unknown content part {kind!r}", param="messages")
    return "".join(out)


def to_canonical(body: ChatRequest) -> CanonicalRequest:
    msgs: list[Message] = []
    for i, m in enumerate(body.messages):
        where = f"messages[{i}]"
        content = _text(m.content, where)
        if m.role in ("system", "developer"):
            msgs.append(Message("system", content))
        elif m.role == "user":
            msgs.append(Message("user", content))
        elif m.role == "assistant":
            calls = tuple(
                ToolCall.replayed(
                    c.id or f"call_{i}_{j}",
                    c.function.name,
                    c.function.arguments if isinstance(c.function.arguments, str) else _dumps(c.function.arguments),
                    f"{where}.tool_calls[{j}]",
                )
                for j, c in enumerate(m.tool_calls or [])
            )
            msgs.append(Message("assistant", content, reasoning=m.reasoning_content or m.reasoning, tool_calls=calls))
        else:
            if m.role == "tool" and not m.tool_call_id:
                raise InvalidRequest(f"{where}: a tool message needs tool_call_id", param="messages")
            msgs.append(Message("tool", content, tool_call_id=m.tool_call_id or m.name, name=m.name))
    tools = []
    for t in body.tools or []:
        if t.type != "function" or t.function is None:
            raise InvalidRequest(f"tool type {t.type!r} is not supported", param="tools")
        tools.append(Tool(t.function.name, t.function.description or "", t.function.parameters or {}))
    stop = [body.stop] if isinstance(body.stop, str) else body.stop
    sampling = {
        "temperature": body.temperature,
        "top_p": body.top_p,
        "top_k": body.top_k,
        "seed": body.seed,
        "max_tokens": body.max_completion_tokens or body.max_tokens,
        "stop": stop,
    }
    return CanonicalRequest(
        model=body.model,
        messages=msgs,
        tools=tools,
        tool_choice=body.tool_choice,
        sampling={k: v for k, v in sampling.items() if v is not None},
        stream=bool(body.stream),
        thinking=None if body.reasoning_effort is None else body.reasoning_effort != "none",
    )


def _dumps(obj: Any) -> str:
    import json

    return json.dumps(obj, ensure_ascii=False)


def _usage(r: TurnResult) -> dict[str, int]:
    return {
        "prompt_tokens": r.usage.prompt_tokens,
        "completion_tokens": r.usage.completion_tokens,
        "total_tokens": r.usage.total_tokens,
    }


def render_json(r: TurnResult) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": r.text or (None if r.tool_calls else "")}
    if r.reasoning:
        message["reasoning_content"] = r.reasoning
    if r.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in r.tool_calls
        ]
    return {
        "id": f"chatcmpl-{r.call_id}",
        "object": "chat.completion",
        "created": r.created,
        "model": r.model,
        "choices": [
            {"index": 0, "message": message, "finish_reason": _FINISH.get(r.finish_reason, "stop"), "logprobs": None}
        ],
        "usage": _usage(r),
    }


async def stream(turn: Turn, include_usage: bool, error_body: ErrorBody) -> AsyncIterator[bytes]:
    r = turn.result
    base = {
        "id": f"chatcmpl-{r.call_id}",
        "object": "chat.completion.chunk",
        "created": r.created or int(time.time()),
        "model": r.model,
    }

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return sse({**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]})

    yield Lead(chunk({"role": "assistant", "content": ""}))
    try:
        async for ev in turn.events():
            if isinstance(ev, TextDelta):
                yield chunk({"content": ev.text})
            elif isinstance(ev, ReasoningDelta):
                yield chunk({"reasoning_content": ev.text})
            elif isinstance(ev, ToolCallDelta):
                c = ev.call
                yield chunk(
                    {
                        "tool_calls": [
                            {
                                "index": ev.index,
                                "id": c.id,
                                "type": "function",
                                "function": {"name": c.name, "arguments": ""},
                            }
                        ]
                    }
                )
                yield chunk({"tool_calls": [{"index": ev.index, "function": {"arguments": c.arguments}}]})
    except GatewayError as err:
        yield sse(error_body(err))
        return
    yield chunk({}, _FINISH.get(r.finish_reason, "stop"))
    if include_usage:
        yield sse({**base, "choices": [], "usage": _usage(r)})
    yield b"data: [DONE]\n\n"
