"""OpenAI's routes (Chat Completions, Responses, the model list) and OpenAI's error body."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from gateway.errors import (
    ContextOverflow,
    Forbidden,
    GatewayError,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    Unauthenticated,
    Unavailable,
    UpstreamError,
    error_kind,
)
from gateway.protocols import openai_chat, openai_responses
from gateway.routes.calls import gateway_of, run, session_of

__all__ = ["error_body", "router"]

router = APIRouter()

_CLIENT_ERRORS = (InvalidRequest, Unauthenticated, Forbidden, NotFound, PayloadTooLarge)
_TYPES: dict[type[GatewayError], str] = dict.fromkeys(_CLIENT_ERRORS, "invalid_request_error")
_CODES: dict[type[GatewayError], str | None] = {
    InvalidRequest: None,
    Unauthenticated: "invalid_api_key",
    Forbidden: "forbidden",
    NotFound: "not_found",
    PayloadTooLarge: "request_too_large",
    UpstreamError: "upstream_error",
}


def error_body(err: GatewayError) -> dict[str, Any]:
    if isinstance(err, ContextOverflow):  # OpenAI's own message and code for an over-long prompt
        message = (
            f"This model's maximum context length is {err.max_model_len} tokens. However, your messages resulted in "
            f"{err.prompt_tokens} tokens. Please reduce the length of the messages."
        )
        return {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        }
    code = err.kind if isinstance(err, Unavailable) else error_kind(_CODES, err, None)
    etype = error_kind(_TYPES, err, "server_error")
    return {"error": {"message": err.message, "type": etype, "param": err.param, "code": code}}


@router.post("/v1/chat/completions")
async def chat_completions(request: Request, body: openai_chat.ChatRequest) -> Response:
    session = session_of(request, body.model)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    canon = openai_chat.to_canonical(body)
    return await run(request, session, canon, openai_chat, lambda t: openai_chat.stream(t, include_usage, error_body))


@router.post("/v1/responses")
async def responses(request: Request, body: openai_responses.ResponsesRequest) -> Response:
    session = session_of(request, body.model)
    canon = openai_responses.to_canonical(body)
    return await run(request, session, canon, openai_responses, lambda t: openai_responses.stream(t, body, error_body))


@router.get("/v1/models")
async def models(request: Request) -> dict[str, Any]:
    session = session_of(request, None)
    names = dict.fromkeys([session.model, *gateway_of(request).settings.model_aliases])
    return {
        "object": "list",
        "data": [{"id": n, "object": "model", "created": int(time.time()), "owned_by": "floe"} for n in names],
    }
