"""OpenAI Responses (``POST /v1/responses``): wire models, canonical mapping, the event stream.

Quirks handled (docs/harnesses.md, "Codex CLI"): Codex sends its system prompt as ``developer`` messages, replays
``function_call`` / ``function_call_output`` items carrying ``id`` fields, ``reasoning`` items, non-function tools
(``namespace``, ``web_search``: dropped and noted), ``include``, ``store:false``, ``prompt_cache_key``. There is no
server-side state: ``previous_response_id`` is refused with a 400 (``store`` is never honoured).

Stream grammar: ``response.created``, ``response.in_progress``, per output item ``response.output_item.added`` ...
deltas (``response.output_text.delta``, ``response.reasoning_summary_text.delta``,
``response.function_call_arguments.delta``) ... ``response.output_item.done``; then ``response.completed`` (or
``response.incomplete`` after a length stop) — the terminal event only after the record is durable. Every event
carries ``type`` and ``sequence_number`` and is sent with an ``event:`` line.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

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

__all__ = ["PROTOCOL", "ResponsesRequest", "render_json", "stream", "to_canonical"]

PROTOCOL = Protocol.OPENAI_RESPONSES


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow")


class RTool(_Wire):
    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Reasoning(_Wire):
    effort: str | None = None
    summary: str | None = None


class ResponsesRequest(_Wire):
    model: str = Field(min_length=1)
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[RTool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    max_output_tokens: int | None = Field(default=None, ge=1)
    stream: bool | None = False
    reasoning: Reasoning | None = None
    previous_response_id: str | None = None
    parallel_tool_calls: bool | None = None


def _parts_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(f"{where}: content must be a string or a list of parts", param="input")
    out = []
    for p in content:
        kind = p.get("type") if isinstance(p, dict) else None
        if kind in ("input_text", "output_text", "text", "summary_text", "reasoning_text"):
            out.append(str(p.get("text", "")))
        elif kind in ("input_image", "input_file", "input_audio"):
            raise UnsupportedContent(f"{where}: {kind!r} is not supported (text-only model)", param="input")
        elif kind == "refusal":
            out.append(str(p.get("refusal", "")))
        else:
            raise InvalidRequest(f"{where}: unknown content part {kind!r}", param="input")
    return "".join(out)


def to_canonical(body: ResponsesRequest) -> CanonicalRequest:
    if body.previous_response_id:
        raise InvalidRequest(
            "previous_response_id is not supported: send the whole conversation (store=false)",
            param="previous_response_id",
        )
    msgs: list[Message] = []
    if body.instructions:
        msgs.append(Message("system", body.instructions))
    items = [{"type": "message", "role": "user", "content": body.input}] if isinstance(body.input, str) else body.input
    pending_reasoning: list[str] = []

    def assistant() -> Message | None:
        return msgs[-1] if msgs and msgs[-1].role == "assistant" and not msgs[-1].content else None

    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise InvalidRequest(f"{where}: must be an object", param="input")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            text = _parts_text(item.get("content", ""), where)
            if role in ("system", "developer"):
                msgs.append(Message("system", text))
            elif role == "user":
                msgs.append(Message("user", text))
            elif role == "assistant":
                prev = assistant()
                reasoning = "".join(pending_reasoning) or None
                pending_reasoning.clear()
                if prev is not None and not prev.tool_calls:
                    msgs[-1] = Message("assistant", text, reasoning=prev.reasoning or reasoning)
                else:
                    msgs.append(Message("assistant", text, reasoning=reasoning))
            else:
                raise InvalidRequest(f"{where}: unknown role {role!r}", param="input")
        elif kind == "function_call":
            if not isinstance(item.get("name"), str) or not isinstance(item.get("call_id"), str):
                raise InvalidRequest(f"{where}: function_call needs name and call_id", param="input")
            call = ToolCall.replayed(item["call_id"], item["name"], str(item.get("arguments", "")), where)
            last = msgs[-1] if msgs else None
            if last is not None and last.role == "assistant":
                msgs[-1] = Message(
                    "assistant", last.content, reasoning=last.reasoning, tool_calls=(*last.tool_calls, call)
                )
            else:
                reasoning = "".join(pending_reasoning) or None
                pending_reasoning.clear()
                msgs.append(Message("assistant", "", reasoning=reasoning, tool_calls=(call,)))
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise InvalidRequest(f"{where}: function_call_output needs call_id", param="input")
            output = item.get("output", "")
            msgs.append(Message("tool", _parts_text(output, where), tool_call_id=item["call_id"]))
        elif kind == "reasoning":
            summary = item.get("summary") or []
            text = _parts_text(summary, where) if summary else _parts_text(item.get("content") or [], where)
            pending_reasoning.append(text)
        else:
            raise InvalidRequest(f"{where}: unsupported input item type {kind!r}", param="input")
    tools = [
        Tool(t.name, t.description or "", t.parameters or {})
        for t in body.tools or []
        if t.type == "function" and t.name
    ]
    sampling = {
        k: v
        for k, v in {"temperature": body.temperature, "top_p": body.top_p, "max_tokens": body.max_output_tokens}.items()
        if v is not None
    }
    thinking = None if body.reasoning is None or body.reasoning.effort is None else body.reasoning.effort != "none"
    return CanonicalRequest(
        model=body.model,
        messages=msgs,
        tools=tools,
        tool_choice=body.tool_choice,
        sampling=sampling,
        stream=bool(body.stream),
        thinking=thinking,
    )


def _items(r: TurnResult) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if r.reasoning:
        out.append(_reasoning_item(r, r.reasoning))
    if r.text or not r.tool_calls:
        out.append(_message_item(r, r.text))
    out.extend(_call_item(c, i) for i, c in enumerate(r.tool_calls))
    return out


def _reasoning_item(r: TurnResult, text: str) -> dict[str, Any]:
    return {"type": "reasoning", "id": f"rs_{r.call_id}", "summary": [{"type": "summary_text", "text": text}]}


def _message_item(r: TurnResult, text: str, status: str = "completed") -> dict[str, Any]:
    return {
        "type": "message",
        "id": f"msg_{r.call_id}",
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}] if status == "completed" else [],
    }


def _call_item(c: ToolCall, i: int) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": f"fc_{c.id.removeprefix('call_')}",
        "call_id": c.id,
        "name": c.name,
        "arguments": c.arguments,
        "status": "completed",
    }


def _response(
    r: TurnResult, status: str, output: list[dict[str, Any]], body: ResponsesRequest | None = None
) -> dict[str, Any]:
    resp: dict[str, Any] = {
        "id": f"resp_{r.call_id}",
        "object": "response",
        "created_at": r.created or int(time.time()),
        "status": status,
        "model": r.model,
        "output": output,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": body.instructions if body else None,
        "metadata": {},
        "parallel_tool_calls": True,
        "temperature": None,
        "top_p": None,
        "tool_choice": "auto",
        "tools": [],
    }
    if status in ("completed", "incomplete"):
        resp["usage"] = {
            "input_tokens": r.usage.prompt_tokens,
            "output_tokens": r.usage.completion_tokens,
            "total_tokens": r.usage.total_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        }
    return resp


def render_json(r: TurnResult) -> dict[str, Any]:
    return _response(r, "incomplete" if r.finish_reason == "length" else "completed", _items(r))


async def stream(turn: Turn, body: ResponsesRequest, error_body: ErrorBody) -> AsyncIterator[bytes]:
    r = turn.result
    seq = 0

    def ev(kind: str, **fields: Any) -> bytes:
        nonlocal seq
        data = {"type": kind, "sequence_number": seq, **fields}
        seq += 1
        return sse(data, kind)

    yield Lead(ev("response.created", response=_response(r, "in_progress", [], body)))
    yield Lead(ev("response.in_progress", response=_response(r, "in_progress", [], body)))
    done: list[dict[str, Any]] = []
    open_kind: str | None = None
    buf: list[str] = []

    def close_open() -> list[bytes]:
        nonlocal open_kind
        if open_kind is None:
            return []
        idx = len(done)
        text = "".join(buf)
        buf.clear()
        out: list[bytes] = []
        if open_kind == "message":
            item = _message_item(r, text)
            part = {"type": "output_text", "text": text, "annotations": []}
            out.append(
                ev(
                    "response.output_text.done",
                    item_id=item["id"],
                    output_index=idx,
                    content_index=0,
                    text=text,
                    logprobs=[],
                )
            )
            out.append(
                ev("response.content_part.done", item_id=item["id"], output_index=idx, content_index=0, part=part)
            )
        else:
            item = _reasoning_item(r, text)
            out.append(
                ev(
                    "response.reasoning_summary_text.done",
                    item_id=item["id"],
                    output_index=idx,
                    summary_index=0,
                    text=text,
                )
            )
        out.append(ev("response.output_item.done", output_index=idx, item=item))
        done.append(item)
        open_kind = None
        return out

    try:
        async for e in turn.events():
            if isinstance(e, (TextDelta, ReasoningDelta)):
                kind = "message" if isinstance(e, TextDelta) else "reasoning"
                idx = len(done)
                if open_kind != kind:
                    for b in close_open():
                        yield b
                    idx = len(done)
                    open_kind = kind
                    if kind == "message":
                        item = _message_item(r, "", status="in_progress")
                        yield Lead(ev("response.output_item.added", output_index=idx, item=item))
                        yield Lead(
                            ev(
                                "response.content_part.added",
                                item_id=item["id"],
                                output_index=idx,
                                content_index=0,
                                part={"type": "output_text", "text": "", "annotations": []},
                            )
                        )
                    else:
                        yield Lead(
                            ev(
                                "response.output_item.added",
                                output_index=idx,
                                item={"type": "reasoning", "id": f"rs_{r.call_id}", "summary": []},
                            )
                        )
                buf.append(e.text)
                if kind == "message":
                    yield ev(
                        "response.output_text.delta",
                        item_id=f"msg_{r.call_id}",
                        output_index=idx,
                        content_index=0,
                        delta=e.text,
                        logprobs=[],
                    )
                else:
                    yield ev(
                        "response.reasoning_summary_text.delta",
                        item_id=f"rs_{r.call_id}",
                        output_index=idx,
                        summary_index=0,
                        delta=e.text,
                    )
            elif isinstance(e, ToolCallDelta):
                for b in close_open():
                    yield b
                idx = len(done)
                item = _call_item(e.call, e.index)
                yield Lead(
                    ev(
                        "response.output_item.added",
                        output_index=idx,
                        item={**item, "arguments": "", "status": "in_progress"},
                    )
                )
                yield ev(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=idx,
                    delta=item["arguments"],
                )
                yield ev(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=idx,
                    arguments=item["arguments"],
                    name=item["name"],
                )
                yield ev("response.output_item.done", output_index=idx, item=item)
                done.append(item)
    except GatewayError as err:
        body_err = error_body(err)["error"]
        yield ev("error", code=body_err.get("code"), message=body_err["message"], param=body_err.get("param"))
        return
    for b in close_open():
        yield b
    if not done:
        item = _message_item(r, "")
        yield Lead(ev("response.output_item.added", output_index=0, item=_message_item(r, "", status="in_progress")))
        yield ev("response.output_item.done", output_index=0, item=item)
        done.append(item)
    status = "incomplete" if r.finish_reason == "length" else "completed"
    yield ev(f"response.{status}", response=_response(r, status, done, body))
