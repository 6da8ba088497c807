"""Gateway errors, and the only place where HTTP status codes live (style #8).

Domain code raises typed errors; each provider route renders them in the vendor's own shape::

    GatewayError                         (500, never expected; mapped to an api error, no stack trace)
    ├── InvalidRequest                   400  malformed JSON, wrong types, missing fields
    │   ├── UnsupportedContent           400  images/audio/files: the engine is text-only
    │   └── ContextOverflow              400  prompt (+ max tokens) exceeds the engine's context
    ├── Unauthenticated                  401  unknown, expired, closed or forged session token
    ├── Forbidden                        403  admin route without the control token
    ├── NotFound                         404  unknown route or session
    ├── PayloadTooLarge                  413  body above ``max_body_bytes``
    ├── Unavailable (retry_after)        503  retriable: the harness should retry after ``retry_after`` s
    │   ├── Paused                            gateway paused for a weight sync
    │   ├── RecordUnavailable                 the record could not be handed to Kafka durably
    │   └── UpstreamUnavailable               no engine replica reachable
    └── UpstreamError                    502  the engine answered something we cannot use

``render_openai`` / ``render_anthropic`` / ``render_google`` return ``(status, body, headers)``; the ``*_stream_*``
variants give the in-stream error event used once a stream has started (the HTTP status is already sent then).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

__all__ = [
    "ContextOverflow",
    "Forbidden",
    "GatewayError",
    "InvalidRequest",
    "NotFound",
    "Paused",
    "PayloadTooLarge",
    "Provider",
    "RecordUnavailable",
    "Unauthenticated",
    "Unavailable",
    "UnsupportedContent",
    "UpstreamError",
    "UpstreamUnavailable",
    "http_status",
    "render",
    "render_stream_error",
]

Provider = Literal["openai", "anthropic", "google"]


class GatewayError(Exception):
    kind: ClassVar[str] = "internal"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidRequest(GatewayError):
    kind = "invalid_request"


class UnsupportedContent(InvalidRequest):
    kind = "unsupported_content"


class ContextOverflow(InvalidRequest):
    kind = "context_overflow"

    def __init__(self, prompt_tokens: int, max_model_len: int) -> None:
        super().__init__(
            f"prompt is too long: {prompt_tokens} tokens > {max_model_len} maximum context length", param="messages"
        )
        self.prompt_tokens = prompt_tokens
        self.max_model_len = max_model_len


class Unauthenticated(GatewayError):
    kind = "unauthenticated"

    def __init__(self, message: str, *, reason: str = "unknown") -> None:
        super().__init__(message)
        self.reason = reason


class Forbidden(GatewayError):
    kind = "forbidden"


class NotFound(GatewayError):
    kind = "not_found"


class PayloadTooLarge(GatewayError):
    kind = "payload_too_large"


class Unavailable(GatewayError):
    kind = "unavailable"

    def __init__(self, message: str, *, retry_after: float = 5.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Paused(Unavailable):
    kind = "paused"


class RecordUnavailable(Unavailable):
    kind = "record_unavailable"


class UpstreamUnavailable(Unavailable):
    kind = "upstream_unavailable"


class UpstreamError(GatewayError):
    kind = "upstream_error"


_STATUS: dict[type[GatewayError], int] = {
    InvalidRequest: 400,
    Unauthenticated: 401,
    Forbidden: 403,
    NotFound: 404,
    PayloadTooLarge: 413,
    Unavailable: 503,
    UpstreamError: 502,
    GatewayError: 500,
}


def http_status(err: GatewayError) -> int:
    for cls in type(err).__mro__:
        if cls in _STATUS:
            return _STATUS[cls]
    return 500


def _headers(err: GatewayError) -> dict[str, str]:
    if isinstance(err, Unavailable):
        return {"retry-after": str(max(1, round(err.retry_after)))}
    return {}


def _openai_body(err: GatewayError) -> dict[str, Any]:
    status = http_status(err)
    if isinstance(err, ContextOverflow):
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
    codes: dict[int, tuple[str, str | None]] = {
        400: ("invalid_request_error", None),
        401: ("invalid_request_error", "invalid_api_key"),
        403: ("invalid_request_error", "forbidden"),
        404: ("invalid_request_error", "not_found"),
        413: ("invalid_request_error", "request_too_large"),
        502: ("server_error", "upstream_error"),
        503: ("server_error", err.kind),
    }
    etype, code = codes.get(status, ("server_error", None))
    return {"error": {"message": err.message, "type": etype, "param": err.param, "code": code}}


def _anthropic_body(err: GatewayError) -> dict[str, Any]:
    status = http_status(err)
    etype = {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        413: "request_too_large",
        502: "api_error",
        503: "overloaded_error",
    }.get(status, "api_error")
    return {"type": "error", "error": {"type": etype, "message": err.message}}


def _google_body(err: GatewayError) -> dict[str, Any]:
    status = http_status(err)
    gstatus = {
        400: "INVALID_ARGUMENT",
        401: "UNAUTHENTICATED",
        403: "PERMISSION_DENIED",
        404: "NOT_FOUND",
        413: "INVALID_ARGUMENT",
        502: "INTERNAL",
        503: "UNAVAILABLE",
    }.get(status, "INTERNAL")
    message = err.message
    if isinstance(err, ContextOverflow):
        message = (
            f"The input token count ({err.prompt_tokens}) exceeds the maximum number of tokens allowed "
            f"({err.max_model_len})."
        )
    return {"error": {"code": status, "message": message, "status": gstatus}}


def render(provider: Provider, err: GatewayError) -> tuple[int, dict[str, Any], dict[str, str]]:
    """``(status, body, headers)`` of the provider-shaped error response."""
    body = {"openai": _openai_body, "anthropic": _anthropic_body, "google": _google_body}[provider](err)
    return http_status(err), body, _headers(err)


def render_stream_error(provider: Provider, err: GatewayError) -> dict[str, Any]:
    """The body of the in-stream error event (after headers were sent). Same shapes as the JSON errors: Anthropic
    sends it as an ``event: error``, OpenAI and Google as a ``data:`` line."""
    return render(provider, err)[1]
