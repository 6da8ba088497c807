"""Anthropic Messages (``POST /v1/messages``, ``/v1/messages/count_tokens``): wire models, canonical mapping, SSE.

Quirks handled (docs/harnesses.md, "Claude Code"): a ``role: "system"`` message inside ``messages`` (Claude Code),
system as a string or blocks with ``cache_control``, ``thinking: {type: adaptive|enabled}``, ``output_config``,
``context_management`` and ``metadata`` accepted and ignored, server tools (``type`` other than custom) dropped and
noted. A user turn's ``tool_result`` blocks become canonical tool messages (in order), its text a user message. Images
and documents are refused with a 400.

Stream grammar: ``message_start``, then per block ``content_block_start`` / ``content_block_delta`` (``text_delta``,
``thinking_delta`` + ``signature_delta``, ``input_json_delta``) / ``content_block_stop``, a ``ping``, then
``message_delta`` (stop reason, usage) and ``message_stop`` — the last two only after the record is durable.
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
from gateway.protocols.sse import Lead, sse

__all__ = ["PROTOCOL", "CountTokensRequest", "MessagesRequest", "render_json", "stream", "to_canonical"]

PROTOCOL = Protocol.ANTHROPIC_MESSAGES
_STOP = {"stop": "end_turn", "stop_sequence": "stop_sequence", "length": "max_tokens", "tool_calls": "tool_use"}
_SIGNATURE = "floe-unsigned"


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow")


class AMessage(_Wire):
    role: Literal["user", "assistant", "system"]
    content: str | list[dict[str, Any]]


class AToolWire(_Wire):
    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None


class ThinkingConfig(_Wire):
    type: str


class _Common(_Wire):
    model: str = Field(min_length=1)
    messages: list[AMessage] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[AToolWire] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: ThinkingConfig | None = None


class MessagesRequest(_Common):
    max_tokens: int = Field(ge=1)
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    stop_sequences: list[str] | None = None
    stream: bool | None = False
    metadata: dict[str, Any] | None = None


class CountTokensRequest(_Common):
    pass


def _blocks(content: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def _block_text(block: dict[str, Any], where: str) -> str:
    kind = block.get("type")
    if kind == "text" and isinstance(block.get("text"), str):
        return str(block["text"])
    if kind in ("image", "document", "search_result", "container_upload"):
        raise UnsupportedContent(f"{where}: content block {kind!r} is not supported (text-only model)")
    raise InvalidRequest(f"{where}: unexpected content block {kind!r}")


def _tool_result_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_block_text(b, where) for b in content if isinstance(b, dict))
    raise InvalidRequest(f"{where}: tool_result content must be a string or a list of blocks")


def to_canonical(body: _Common) -> CanonicalRequest:
    msgs: list[Message] = []
    if body.system is not None:
        text = body.system if isinstance(body.system, str) else "\n".join(_block_text(b, "system") for b in body.system)
        msgs.append(Message("system", text))
    for i, m in enumerate(body.messages):
        where = f"messages[{i}]"
        blocks = _blocks(m.content)
        if m.role == "system":
            msgs.append(Message("system", "".join(_block_text(b, where) for b in blocks)))
        elif m.role == "user":
            texts: list[str] = []
            for b in blocks:
                if b.get("type") == "tool_result":
                    if not isinstance(b.get("tool_use_id"), str):
                        raise InvalidRequest(f"{where}: tool_result needs tool_use_id")
                    msgs.append(
                        Message("tool", _tool_result_text(b.get("content"), where), tool_call_id=b["tool_use_id"])
                    )
                else:
                    texts.append(_block_text(b, where))
            if texts:
                msgs.append(Message("user", "".join(texts)))
        else:
            text_parts: list[str] = []
            reasoning: list[str] = []
            calls: list[ToolCall] = []
            for b in blocks:
                kind = b.get("type")
                if kind == "thinking":
                    reasoning.append(str(b.get("thinking", "")))
                elif kind == "redacted_thinking":
                    continue
                elif kind in ("tool_use", "server_tool_use"):
                    if not isinstance(b.get("name"), str):
                        raise InvalidRequest(f"{where}: tool_use needs a name")
                    calls.append(
                        ToolCall(str(b.get("id", "")), b["name"], json.dumps(b.get("input", {}), ensure_ascii=False))
                    )
                else:
                    text_parts.append(_block_text(b, where))
            msgs.append(
                Message("assistant", "".join(text_parts), reasoning="".join(reasoning) or None, tool_calls=tuple(calls))
            )
    tools = [
        Tool(t.name, t.description or "", t.input_schema or {}) for t in body.tools or [] if t.type in (None, "custom")
    ]
    thinking = None if body.thinking is None else body.thinking.type in ("enabled", "adaptive")
    sampling: dict[str, Any] = {}
    stream = False
    side = None
    if isinstance(body, MessagesRequest):
        sampling = {
            k: v
            for k, v in {
                "temperature": body.temperature,
                "top_p": body.top_p,
                "top_k": body.top_k,
                "max_tokens": body.max_tokens,
                "stop": body.stop_sequences,
            }.items()
            if v is not None
        }
        stream = bool(body.stream)
        oc = getattr(body, "output_config", None)
        if not tools and isinstance(oc, dict) and oc.get("format"):
            side = "title"
    return CanonicalRequest(
        model=body.model,
        messages=msgs,
        tools=tools,
        tool_choice=body.tool_choice,
        sampling=sampling,
        stream=stream,
        thinking=thinking,
        side_call=side,
    )


def _content(r: TurnResult) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if r.reasoning:
        out.append({"type": "thinking", "thinking": r.reasoning, "signature": _SIGNATURE})
    if r.text or not r.tool_calls:
        out.append({"type": "text", "text": r.text})
    for c in r.tool_calls:
        out.append({"type": "tool_use", "id": _tool_id(c.id), "name": c.name, "input": _input(c)})
    return out


def _tool_id(cid: str) -> str:
    return cid if cid.startswith("toolu_") else "toolu_" + cid.removeprefix("call_")


def _input(c: ToolCall) -> Any:
    obj = c.arguments_obj()
    return obj if isinstance(obj, dict) else {"input": obj}


def _usage(r: TurnResult) -> dict[str, int]:
    return {
        "input_tokens": r.usage.prompt_tokens,
        "output_tokens": r.usage.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def render_json(r: TurnResult) -> dict[str, Any]:
    return {
        "id": f"msg_{r.call_id}",
        "type": "message",
        "role": "assistant",
        "model": r.model,
        "content": _content(r),
        "stop_reason": _STOP.get(r.finish_reason, "end_turn"),
        "stop_sequence": None,
        "usage": _usage(r),
    }


async def stream(turn: Turn, error_body: ErrorBody) -> AsyncIterator[bytes]:
    r = turn.result
    start: dict[str, Any] = {
        "id": f"msg_{r.call_id}",
        "type": "message",
        "role": "assistant",
        "model": r.model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": len(turn._prompt_ids), "output_tokens": 0},
    }
    yield Lead(sse({"type": "message_start", "message": start}, "message_start"))
    yield Lead(sse({"type": "ping"}, "ping"))
    index = -1
    open_kind: str | None = None

    def stop_block() -> bytes:
        extra = b""
        if open_kind == "thinking":
            extra = sse(
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "signature_delta", "signature": _SIGNATURE},
                },
                "content_block_delta",
            )
        return extra + sse({"type": "content_block_stop", "index": index}, "content_block_stop")

    try:
        async for ev in turn.events():
            if isinstance(ev, (TextDelta, ReasoningDelta)):
                kind = "text" if isinstance(ev, TextDelta) else "thinking"
                if open_kind != kind:
                    if open_kind is not None:
                        yield stop_block()
                    index += 1
                    open_kind = kind
                    block = (
                        {"type": "text", "text": ""}
                        if kind == "text"
                        else {"type": "thinking", "thinking": "", "signature": ""}
                    )
                    yield Lead(
                        sse(
                            {"type": "content_block_start", "index": index, "content_block": block},
                            "content_block_start",
                        )
                    )
                delta = (
                    {"type": "text_delta", "text": ev.text}
                    if kind == "text"
                    else {"type": "thinking_delta", "thinking": ev.text}
                )
                yield sse({"type": "content_block_delta", "index": index, "delta": delta}, "content_block_delta")
            elif isinstance(ev, ToolCallDelta):
                if open_kind is not None:
                    yield stop_block()
                index += 1
                open_kind = None
                c = ev.call
                yield Lead(
                    sse(
                        {
                            "type": "content_block_start",
                            "index": index,
                            "content_block": {"type": "tool_use", "id": _tool_id(c.id), "name": c.name, "input": {}},
                        },
                        "content_block_start",
                    )
                )
                yield sse(
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {
                            "type": "input_json_delta",
                            "partial_json": json.dumps(_input(c), ensure_ascii=False),
                        },
                    },
                    "content_block_delta",
                )
                yield sse({"type": "content_block_stop", "index": index}, "content_block_stop")
    except GatewayError as err:
        yield sse(error_body(err), "error")
        return
    if open_kind is not None:
        yield stop_block()
    elif index < 0:  # an empty answer still has one (empty) text block, as the JSON form does
        yield sse(
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            "content_block_start",
        )
        yield sse({"type": "content_block_stop", "index": 0}, "content_block_stop")
    yield sse(
        {
            "type": "message_delta",
            "delta": {"stop_reason": _STOP.get(r.finish_reason, "end_turn"), "stop_sequence": None},
            "usage": {"input_tokens": r.usage.prompt_tokens, "output_tokens": r.usage.completion_tokens},
        },
        "message_delta",
    )
    yield sse({"type": "message_stop"}, "message_stop")
