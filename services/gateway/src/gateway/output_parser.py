"""Incremental parser of the engine's completion text into text, reasoning and tool calls.

Used on every engine text: in exact mode (``/v1/completions`` has no tool parser on vLLM or the CPU engine) all tool
calls are found here, so a parse failure is observable (docs/peers.md, "Observable parse failures"); in canonical mode
both engines parse calls themselves (``delta.tool_calls``, assembled by ``upstream.EngineToolCalls``) and this parser
sees only the text outside them. Grammar, Hermes/Qwen style::

    <think> reasoning </think>          -> ReasoningDelta
    <tool_call>{"name":..,"arguments":{..}}</tool_call>   -> ToolCallDelta (emitted once the JSON is complete)
    anything else                        -> TextDelta

Text is streamed as soon as it cannot be the start of a tag; a tool call is emitted whole. A ``<tool_call>`` whose
body is not valid JSON with a ``name`` is given back as plain text and counted in ``parse_failures`` (never
dropped). Limits: no nested tags; the tags are plain strings (special-token ids are not inspected).
"""

from __future__ import annotations

import json

from gateway.canonical import ReasoningDelta, TextDelta, ToolCall, ToolCallDelta, TurnEvent, new_call_id

__all__ = ["OutputParser"]

_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_CALL_OPEN, _CALL_CLOSE = "<tool_call>", "</tool_call>"


class OutputParser:
    def __init__(self, *, in_reasoning: bool = False) -> None:
        self._buf = ""
        self._state = "reasoning" if in_reasoning else "text"
        self._calls = 0
        self.parse_failures = 0

    def feed(self, text: str) -> list[TurnEvent]:
        if "<" not in text and not self._buf and self._state != "tool_call":
            # The common token: nothing held back and no "<" (every tag starts with one), so no tag can begin in
            # it; out it goes as it is. The general scan below costs ~5 us a token, and runs once per token.
            return [ReasoningDelta(text) if self._state == "reasoning" else TextDelta(text)] if text else []
        self._buf += text
        out: list[TurnEvent] = []
        while True:
            progressed = self._step(out, final=False)
            if not progressed:
                return out

    def finish(self) -> list[TurnEvent]:
        out: list[TurnEvent] = []
        while self._step(out, final=True):
            pass
        if self._buf:
            if self._state == "tool_call":
                self.parse_failures += 1
                out.append(TextDelta(_CALL_OPEN + self._buf))
            elif self._state == "reasoning":
                out.append(ReasoningDelta(self._buf))
            else:
                out.append(TextDelta(self._buf))
            self._buf = ""
        return out

    def _emit_plain(self, out: list[TurnEvent], s: str) -> None:
        if not s:
            return
        out.append(ReasoningDelta(s) if self._state == "reasoning" else TextDelta(s))

    def _step(self, out: list[TurnEvent], *, final: bool) -> bool:
        buf = self._buf
        if not buf:
            return False
        if self._state == "tool_call":
            end = buf.find(_CALL_CLOSE)
            if end < 0:
                return False
            body = buf[:end]
            self._buf = buf[end + len(_CALL_CLOSE) :]
            self._state = "text"
            call = self._parse_call(body)
            if call is None:
                self.parse_failures += 1
                out.append(TextDelta(_CALL_OPEN + body + _CALL_CLOSE))
            else:
                out.append(ToolCallDelta(self._calls, call))
                self._calls += 1
            return True
        tags = [_THINK_CLOSE] if self._state == "reasoning" else [_THINK_OPEN, _CALL_OPEN]
        hits = [(buf.find(t), t) for t in tags if buf.find(t) >= 0]
        if hits:
            pos, tag = min(hits)
            self._emit_plain(out, buf[:pos])
            self._buf = buf[pos + len(tag) :]
            self._state = {"<think>": "reasoning", "</think>": "text", "<tool_call>": "tool_call"}[tag]
            return True
        # No complete tag: keep back a suffix that could still become one.
        keep = 0 if final else max((k for t in tags for k in range(1, len(t)) if buf.endswith(t[:k])), default=0)
        emit = buf[: len(buf) - keep]
        if not emit:
            return False
        self._emit_plain(out, emit)
        self._buf = buf[len(buf) - keep :]
        return False

    @staticmethod
    def _parse_call(body: str) -> ToolCall | None:
        try:
            obj = json.loads(body.strip())
        except json.JSONDecodeError:
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return None
        args = obj.get("arguments", obj.get("parameters", {}))
        args_text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        return ToolCall(id=f"call_{new_call_id()}", name=obj["name"], arguments=args_text)
