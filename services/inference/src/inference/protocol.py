"""Wire models of the OpenAI-compatible API, shaped like vLLM's (``vllm/entrypoints/openai/protocol.py``).

Role: pydantic models of the requests we accept (responses are assembled in ``serving.py``, in the shapes below, and
documented with examples in the service README). Field names and nesting follow vLLM so that the gateway has one
upstream protocol for this engine and for vLLM:

* chat: ``prompt_token_ids`` at the top level, ``choices[].token_ids`` (when ``return_token_ids``),
  ``choices[].logprobs.content[]`` entries ``{token, logprob, bytes, top_logprobs}``, ``message.reasoning_content``;
* completions: ``choices[].prompt_token_ids`` / ``choices[].token_ids`` and the legacy ``CompletionLogProbs``
  (``tokens``, ``token_logprobs``, ``top_logprobs``, ``text_offset``).

floe additions (ignored by OpenAI clients): top-level ``weight_version`` on every response and on the final stream
chunk, and ``message.reasoning`` mirroring ``reasoning_content`` (newer vLLM's name).
Requests allow extra fields (OpenAI clients send many we do not use), as vLLM does.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# On every response of both engines (the CPU engine and the proxy in front of vLLM); the gateway reads it.
WEIGHT_VERSION_HEADER = "x-floe-weight-version"

__all__ = [
    "WEIGHT_VERSION_HEADER",
    "ChatCompletionRequest",
    "CompletionRequest",
    "DetokenizeRequest",
    "ErrorBody",
    "ErrorResponse",
    "StreamOptions",
    "TokenizeRequest",
    "ToolParam",
    "new_id",
    "now_s",
]


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now_s() -> int:
    return int(time.time())


class _Req(BaseModel):
    model_config = ConfigDict(extra="allow")


class StreamOptions(_Req):
    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


class FunctionDef(_Req):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolParam(_Req):
    type: Literal["function"] = "function"
    function: FunctionDef


class _Sampling(_Req):
    """Sampling fields shared by chat and completions (OpenAI + vLLM extra params)."""

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=100.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    n: int = Field(default=1, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool | None = None
    return_tokens_as_token_ids: bool | None = None
    # vLLM's per-request `stream_interval`: a streamed answer's tokens go out in chunks of this many, the first token
    # and the end at once (fewer events: less CPU in every hop that relays them)
    stream_interval: int | None = Field(default=None, ge=1)
    skip_special_tokens: bool = True

    @field_validator("stop")
    @classmethod
    def _stop_not_empty(cls, value: str | list[str] | None) -> str | list[str] | None:
        items = [value] if isinstance(value, str) else value or []
        if any(not s for s in items):
            raise ValueError("stop strings must be non-empty")
        return value

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class ChatCompletionRequest(_Sampling):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=0, ge=0)
    tools: list[ToolParam] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = True
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    include_reasoning: bool = True

    @field_validator("messages")
    @classmethod
    def _roles(cls, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for i, m in enumerate(messages):
            role = m.get("role")
            if role not in {"system", "developer", "user", "assistant", "tool"}:
                raise ValueError(f"messages[{i}].role must be one of system, developer, user, assistant, tool")
        return messages


class CompletionRequest(_Sampling):
    # Token ids (one prompt), a list of token-id prompts of length 1, or text.
    prompt: list[int] | list[list[int]] | str | list[str]
    logprobs: int | None = Field(default=None, ge=0)
    echo: bool = False
    add_special_tokens: bool = False


class TokenizeRequest(_Req):
    """vLLM's ``/tokenize``: either ``prompt`` (text) or ``messages`` (chat, rendered with the chat template)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    tools: list[ToolParam] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool = False


class DetokenizeRequest(_Req):
    model: str | None = None
    tokens: list[int]


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody
