"""Turn sampled token ids into OpenAI chat output: content, ``reasoning_content`` and ``tool_calls``.

Role: a token-level state machine shared by streaming and non-streaming responses, so both always agree.
``<think>``/``</think>`` and ``<tool_call>``/``</tool_call>`` are single added tokens in our tokenizers (as in Qwen), so
the parser switches state on token ids and never re-tokenizes text. Text is detokenized incrementally per segment,
holding back an incomplete UTF-8 sequence (U+FFFD at the tail) and, when stop strings are set, the last
``len(stop) - 1`` characters so that a stop string is never partly emitted.

Tool calls follow Hermes: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``. A block that is not valid JSON
of that shape (or is cut off) is returned as plain content, never dropped.

Limits: a tool call is emitted as one delta when its closing tag arrives (no partial-argument streaming).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from inference.tokenizer import Tokenizer

__all__ = ["ChatOutputParser", "Delta", "ParsedToolCall", "TextStreamer", "truncate_at_stop"]


def truncate_at_stop(text: str, stop: Sequence[str]) -> str:
    cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
    return text if cut < 0 else text[:cut]


@dataclass(frozen=True)
class ParsedToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI sends it


@dataclass
class Delta:
    content: str = ""
    reasoning: str = ""
    tool_calls: list[ParsedToolCall] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning or self.tool_calls)


class TextStreamer:
    """Incremental detokenizer for one text segment."""

    def __init__(self, tokenizer: Tokenizer, stop: Sequence[str] = ()) -> None:
        self._tok = tokenizer
        self._stop = tuple(stop)
        self._holdback = max((len(s) for s in self._stop), default=1) - 1
        self.ids: list[int] = []
        self.emitted = ""

    def text(self) -> str:
        return self._tok.decode(self.ids, skip_special_tokens=True)

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        text = self.text()
        if text.endswith("\ufffd"):  # an incomplete multi-byte character: wait for the next byte token
            return ""
        safe = len(text)
        if self._stop:
            cut = truncate_at_stop(text, self._stop)
            safe = len(cut) if len(cut) < len(text) else len(text) - self._holdback
        if safe <= len(self.emitted):
            return ""
        new = text[len(self.emitted) : safe]
        self.emitted += new
        return new

    def finish(self) -> str:
        text = self.text()
        if self._stop:
            text = truncate_at_stop(text, self._stop)
        new = text[len(self.emitted) :] if text.startswith(self.emitted) else ""
        self.emitted += new
        return new


def _tool_call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex[:24]}"


def parse_tool_call(body: str) -> ParsedToolCall | None:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    arguments = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return ParsedToolCall(id=_tool_call_id(), name=obj["name"], arguments=arguments)


class ChatOutputParser:
    """Feed token ids one at a time; get ``Delta``s. ``finish()`` flushes; ``result()`` gives the totals."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        stop: Sequence[str] = (),
        parse_tools: bool = True,
        parse_reasoning: bool = True,
    ) -> None:
        self._tok = tokenizer
        self._stop = tuple(stop)
        ids = [tokenizer.token_id(t) for t in ("<think>", "</think>", "<tool_call>", "</tool_call>")]
        self._think, self._think_end, self._tool, self._tool_end = (-1 if i is None else i for i in ids)
        self._parse_tools = parse_tools
        self._parse_reasoning = parse_reasoning
        self._state: Literal["content", "reasoning", "tool"] = "content"
        self._content = TextStreamer(tokenizer, self._stop)
        self._reasoning = TextStreamer(tokenizer, self._stop)
        self._tool_ids: list[int] = []
        self.content = ""
        self.reasoning = ""
        self.tool_calls: list[ParsedToolCall] = []

    def _emit(self, delta: Delta) -> Delta:
        self.content += delta.content
        self.reasoning += delta.reasoning
        self.tool_calls.extend(delta.tool_calls)
        return delta

    def _flush_segments(self) -> Delta:
        return Delta(content=self._content.finish(), reasoning=self._reasoning.finish())

    def push(self, token_id: int) -> Delta:
        delta = Delta()
        if self._parse_reasoning and token_id == self._think and self._state == "content":
            delta = self._flush_segments()
            self._state = "reasoning"
        elif self._parse_reasoning and token_id == self._think_end and self._state == "reasoning":
            delta = self._flush_segments()
            self._state = "content"
        elif self._parse_tools and token_id == self._tool and self._state == "content":
            delta = self._flush_segments()
            self._state = "tool"
            self._tool_ids = []
        elif self._state == "tool" and token_id == self._tool_end:
            self._state = "content"
            body = self._tok.decode(self._tool_ids, skip_special_tokens=True)
            call = parse_tool_call(body)
            if call is not None:
                delta = Delta(tool_calls=[call])
            else:  # not a well-formed call: keep the model's text rather than lose it
                for t in [self._tool, *self._tool_ids, self._tool_end]:
                    delta.content += self._content.push(t)
        elif self._state == "tool":
            self._tool_ids.append(token_id)
        elif self._state == "reasoning":
            delta.reasoning = self._reasoning.push(token_id)
        else:
            delta.content = self._content.push(token_id)
        return self._emit(delta)

    def finish(self) -> Delta:
        delta = Delta()
        if self._state == "tool":  # cut off inside a tool call: surface it as content
            for t in [self._tool, *self._tool_ids]:
                delta.content += self._content.push(t)
        flushed = self._flush_segments()
        delta.content += flushed.content
        delta.reasoning += flushed.reasoning
        return self._emit(delta)
