"""Google's Gemini routes (``models/{model}:method`` under ``/v1beta`` and ``/v1``) and Google's error body."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from gateway.core import Turn
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
    http_status,
)
from gateway.protocols import google_generate
from gateway.protocols.sse import SSE_HEADERS
from gateway.responses import EventStream
from gateway.routes.calls import gateway_of, prompt_tokens, run, session_of

__all__ = ["error_body", "router"]

router = APIRouter()

_STATUSES: dict[type[GatewayError], str] = {
    InvalidRequest: "INVALID_ARGUMENT",
    Unauthenticated: "UNAUTHENTICATED",
    Forbidden: "PERMISSION_DENIED",
    NotFound: "NOT_FOUND",
    PayloadTooLarge: "INVALID_ARGUMENT",
    UpstreamError: "INTERNAL",
    Unavailable: "UNAVAILABLE",
}


def error_body(err: GatewayError) -> dict[str, Any]:
    message = err.message
    if isinstance(err, ContextOverflow):  # Gemini's own wording for an over-long prompt
        message = (
            f"The input token count ({err.prompt_tokens}) exceeds the maximum number of tokens allowed "
            f"({err.max_model_len})."
        )
    return {"error": {"code": http_status(err), "message": message, "status": error_kind(_STATUSES, err, "INTERNAL")}}


@router.post("/v1beta/models/{model}:generateContent")
@router.post("/v1/models/{model}:generateContent")
async def generate_content(request: Request, model: str, body: google_generate.GenerateRequest) -> Response:
    session = session_of(request, model)
    canon = google_generate.to_canonical(body, model, stream=False)
    return await run(request, session, canon, google_generate, None)


@router.post("/v1beta/models/{model}:countTokens")
@router.post("/v1/models/{model}:countTokens")
async def count_tokens_google(request: Request, model: str, body: google_generate.CountTokensRequest) -> dict[str, int]:
    session = session_of(request, model)
    canon = google_generate.to_canonical(body.as_generate(), model, stream=False)
    return {"totalTokens": await prompt_tokens(request, session, canon)}


@router.post("/v1beta/models/{model}:streamGenerateContent")
@router.post("/v1/models/{model}:streamGenerateContent")
async def stream_generate_content(request: Request, model: str, body: google_generate.GenerateRequest) -> Response:
    session = session_of(request, model)
    canon = google_generate.to_canonical(body, model, stream=True)
    # ?alt=sse: one data: event per chunk; without it Gemini streams a JSON array, element by element.
    sse_mode = request.query_params.get("alt") == "sse"
    turn = Turn(gateway_of(request), session, canon, google_generate.PROTOCOL)
    await turn.start()
    media = "text/event-stream" if sse_mode else "application/json"
    return EventStream(
        google_generate.stream(turn, sse_mode, error_body),
        media_type=media,
        headers=SSE_HEADERS,
        settled=lambda: turn.recorded,
    )
