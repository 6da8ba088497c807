"""The one internal shape every provider API converts to and from.

Role: ``CanonicalRequest`` is what a harness asked for (messages, tools, sampling), independent of the wire API;
``TurnEvent`` values are the typed stream the pipeline yields while the engine samples; ``TurnResult`` is the whole
answer. Provider modules (``gateway.protocols.*``) only translate wire <-> canonical; there is never a
provider-to-provider conversion.

Limits: text only. Images and other media are rejected by the protocol modules with ``UnsupportedContent`` (the CPU
engine has no vision); they are never dropped silently.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.errors import InvalidRequest

__all__ = [
    "CanonicalRequest",
    "FinishReason",
    "Message",
    "ReasoningDelta",
    "Role",
    "TextDelta",
    "Tool",
    "ToolCall",
    "ToolCallDelta",
    "TurnEvent",
    "TurnResult",
    "Usage",
    "new_call_id",
]

Role = Literal["system", "user", "assistant", "tool"]
FinishReason = Literal["stop", "length", "tool_calls", "stop_sequence", "abort", "error"]


def new_call_id() -> str:
    return os.urandom(12).hex()  # 96 random bits, as uuid4().hex[:24] gave, without building a UUID


@dataclass(frozen=True)
class ToolCall:
    """A tool call; ``arguments`` is the JSON text of the arguments object, as the model wrote it."""

    id: str
    name: str
    arguments: str

    @classmethod
    def replayed(cls, id: str, name: str, arguments: str, where: str) -> ToolCall:
        """A tool call a client sends back in its history: its arguments must be a JSON object (the parser only
        ever emits such calls, and chat templates render them as objects)."""
        try:
            obj = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            raise InvalidRequest(f"{where}: tool call arguments are not valid JSON", param="messages") from exc
        if not isinstance(obj, dict):
            raise InvalidRequest(f"{where}: tool call arguments must be a JSON object", param="messages")
        return cls(id, name, arguments)

    def arguments_obj(self) -> Any:
        try:
            return json.loads(self.arguments) if self.arguments else {}
        except json.JSONDecodeError:
            return self.arguments


@dataclass(frozen=True)
class Message:
    role: Role
    content: str = ""
    reasoning: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None

    def semantic_key(self) -> tuple[Any, ...]:
        """Equality that ignores what harnesses legitimately rewrite when they replay history: call ids,
        whitespace around text, and the formatting of argument JSON."""
        calls = tuple((c.name, json.dumps(c.arguments_obj(), sort_keys=True)) for c in self.tool_calls)
        return (self.role, self.content.strip(), calls)

    def to_engine(self) -> dict[str, Any]:
        """OpenAI-chat shaped message for the engine's chat template.

        An assistant message that is only tool calls has ``content: null`` (OpenAI's own convention), never "":
        vLLM hands a string content to the template as a one-part list, ``[{"type": "text", "text": ""}]``, which
        Jinja finds truthy, so a template that separates content from the calls (``{% if message.content %}``)
        renders a separator for nothing there and vLLM's prompt differs from the CPU engine's (transformers')."""
        content: str | None = (
            None if (self.tool_calls and not self.content and self.role == "assistant") else self.content
        )
        out: dict[str, Any] = {"role": self.role, "content": content}
        if self.reasoning:
            out["reasoning_content"] = self.reasoning
        if self.tool_calls:
            out["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments or "{}"}}
                for c in self.tool_calls
            ]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name and self.role == "tool":
            out["name"] = self.name
        return out


@dataclass(frozen=True)
class Tool:
    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)

    def to_engine(self) -> dict[str, Any]:
        params = self.parameters or {"type": "object", "properties": {}}
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": params},
        }


@dataclass
class CanonicalRequest:
    """What the harness asked for. ``sampling`` holds the harness's own values (temperature, top_p, top_k,
    max_tokens, stop, seed); the pipeline records them and applies the session's policy on top."""

    model: str
    messages: list[Message]
    tools: list[Tool] = field(default_factory=list)
    tool_choice: str | dict[str, Any] | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    stream: bool = False
    thinking: bool | None = None
    side_call: str | None = None  # e.g. "title", "router", "memory": classified, still recorded

    def to_record(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "messages": [m.to_engine() for m in self.messages],
            "tools": [t.to_engine() for t in self.tools],
            "tool_choice": self.tool_choice,
            "sampling": self.sampling,
            "stream": self.stream,
            "thinking": self.thinking,
            "side_call": self.side_call,
        }


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True)
class ToolCallDelta:
    """One whole parsed tool call (the parser only emits a call once its JSON is complete)."""

    index: int
    call: ToolCall


@dataclass
class TurnResult:
    """The whole answer of one call, as the client receives it."""

    call_id: str
    model: str
    text: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: FinishReason = "stop"
    usage: Usage = Usage()
    created: int = 0

    def as_message(self) -> Message:
        return Message(
            role="assistant", content=self.text, reasoning=self.reasoning or None, tool_calls=tuple(self.tool_calls)
        )


TurnEvent = TextDelta | ReasoningDelta | ToolCallDelta
