"""Anthropic's routes (Messages, token counting) and Anthropic's error body."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from gateway.errors import (
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
from gateway.protocols import anthropic_messages
from gateway.routes.calls import prompt_tokens, run, session_of

__all__ = ["error_body", "router"]

router = APIRouter()

_TYPES: dict[type[GatewayError], str] = {
    InvalidRequest: "invalid_request_error",
    Unauthenticated: "authentication_error",
    Forbidden: "permission_error",
    NotFound: "not_found_error",
    PayloadTooLarge: "request_too_large",
    UpstreamError: "api_error",
    Unavailable: "overloaded_error",
}


def error_body(err: GatewayError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_kind(_TYPES, err, "api_error"), "message": err.message}}


@router.post("/v1/messages")
async def messages(request: Request, body: anthropic_messages.MessagesRequest) -> Response:
    session = session_of(request, body.model)
    canon = anthropic_messages.to_canonical(body)
    return await run(request, session, canon, anthropic_messages, lambda t: anthropic_messages.stream(t, error_body))


@router.post("/v1/messages/count_tokens")
async def count_tokens(request: Request, body: anthropic_messages.CountTokensRequest) -> dict[str, int]:
    session = session_of(request, body.model)
    return {"input_tokens": await prompt_tokens(request, session, anthropic_messages.to_canonical(body))}
