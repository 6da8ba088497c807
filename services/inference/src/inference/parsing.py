"""Turn sampled token ids into OpenAI chat output: content, ``reasoning_content`` and ``tool_calls``.

Role: a token-level state machine shared by streaming and non-streaming responses, so both always agree.
``<think>``/``</think>`` and ``<tool_call>``/``</tool_call>`` are single added tokens in our tokenizers (as in Qwen), so
the parser switches state on token ids and never re-tokenizes text. Text is detokenized incrementally per segment,
holding back an incomplete UTF-8 sequence (U+FFFD at the tail) and, when stop strings are set, the last
``len(stop) - 1`` characters so that a stop string is never partly emitted.

Tool calls follow Hermes: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``. A block that is not valid JSON
of that shape (or is cut off) is returned as plain content, never dropped.

Tokenizers without single ``<tool_call>``/``</tool_call>`` tokens (SmolLM2: the tags are several ordinary tokens)
are parsed on the decoded text instead (``TextToolStreamer``, as vLLM's Hermes parser does): content that might be
the start of a tag is held back until it is known not to be one.

Limits: a tool call is emitted as one delta when its closing tag arrives (no partial-argument streaming). In text
mode, a ``<think>`` token inside an unclosed tool call flushes the call as content.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from inference.tokenizer import Tokenizer

__all__ = ["ChatOutputParser", "Delta", "ParsedToolCall", "TextStreamer", "TextToolStreamer", "truncate_at_stop"]


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


TOOL_START, TOOL_END = "<tool_call>", "</tool_call>"


def _partial_tag(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag`` (0 if none)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class TextToolStreamer:
    """Incremental detokenizer for content that may contain Hermes tool calls written as plain text.

    Each push re-decodes the segment and re-scans it; blocks already judged (call or not) keep their verdict, so a
    call is emitted once with one id. ``push``/``finish`` return ``Delta``s with ``content`` and ``tool_calls``.
    """

    def __init__(self, tokenizer: Tokenizer, stop: Sequence[str] = ()) -> None:
        self._tok = tokenizer
        self._stop = tuple(stop)
        self._holdback = max((len(s) for s in self._stop), default=1) - 1
        self._blocks: list[ParsedToolCall | None] = []  # verdict per closed block, in order
        self.ids: list[int] = []
        self.emitted = ""

    def _scan(self, text: str, final: bool) -> tuple[str, list[ParsedToolCall]]:
        content, calls, pos, k = "", [], 0, 0
        while True:
            start = text.find(TOOL_START, pos)
            if start < 0:
                tail = text[pos:]
                content += tail if final else tail[: len(tail) - _partial_tag(tail, TOOL_START)]
                break
            content += text[pos:start]
            end = text.find(TOOL_END, start + len(TOOL_START))
            if end < 0:  # an open block: content only once generation ended without closing it
                if final:
                    content += text[start:]
                break
            if k == len(self._blocks):
                self._blocks.append(parse_tool_call(text[start + len(TOOL_START) : end]))
            verdict = self._blocks[k]
            if verdict is None:  # not a well-formed call: keep the model's text rather than lose it
                content += text[start : end + len(TOOL_END)]
            else:
                calls.append(verdict)
            pos, k = end + len(TOOL_END), k + 1
        return content, calls

    def _delta(self, final: bool) -> Delta:
        text = self._tok.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd") and not final:  # an incomplete multi-byte character: wait for the next byte token
            return Delta()
        if self._stop:
            cut = truncate_at_stop(text, self._stop)
            if len(cut) == len(text) and not final:
                cut = text[: len(text) - self._holdback]
            text = cut
        emitted_calls = sum(1 for b in self._blocks if b is not None)
        content, calls = self._scan(text, final)
        new = content[len(self.emitted) :] if content.startswith(self.emitted) else ""
        self.emitted += new
        return Delta(content=new, tool_calls=calls[emitted_calls:])

    def push(self, token_id: int) -> Delta:
        self.ids.append(token_id)
        return self._delta(final=False)

    def finish(self) -> Delta:
        return self._delta(final=True)


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
        # Tags that are not single tokens can only be found in the text (see the module docstring).
        self._text_tools = (
            TextToolStreamer(tokenizer, self._stop) if parse_tools and -1 in (self._tool, self._tool_end) else None
        )
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
        if self._text_tools is not None:
            flushed = self._text_tools.finish()
            return Delta(content=flushed.content, reasoning=self._reasoning.finish(), tool_calls=flushed.tool_calls)
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
        elif self._text_tools is not None:
            delta = self._text_tools.push(token_id)
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
        delta.tool_calls += flushed.tool_calls
        return self._emit(delta)
