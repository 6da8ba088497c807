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

Each provider's error body (``error_body(err) -> dict``) lives in its routes module, ``gateway.routes.<provider>``,
keyed by error class (``error_kind``); ``render(error_body, err)`` adds the status and headers. Once a stream has
started (the HTTP status is already sent) the protocol module sends the same body as its in-stream error event.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

__all__ = [
    "ContextOverflow",
    "ErrorBody",
    "Forbidden",
    "GatewayError",
    "InvalidRequest",
    "NotFound",
    "Paused",
    "PayloadTooLarge",
    "RecordUnavailable",
    "Unauthenticated",
    "Unavailable",
    "UnsupportedContent",
    "UpstreamError",
    "UpstreamUnavailable",
    "error_kind",
    "http_status",
    "render",
]

T = TypeVar("T")


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


# A provider's error body: OpenAI ``{error:{message,type,param,code}}``, Anthropic ``{type:"error",error:{...}}``, ...
ErrorBody = Callable[[GatewayError], dict[str, Any]]


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


def error_kind(table: Mapping[type[GatewayError], T], err: GatewayError, default: T) -> T:
    """The vendor's name for an error (its ``type`` or ``status`` field), looked up by class like ``http_status``;
    provider tables are keyed by class so that status codes stay in this module."""
    for cls in type(err).__mro__:
        if cls in table:
            return table[cls]
    return default


def render(error_body: ErrorBody, err: GatewayError) -> tuple[int, dict[str, Any], dict[str, str]]:
    """``(status, body, headers)`` of the provider-shaped error response (``error_body`` is the provider's)."""
    return http_status(err), error_body(err), _headers(err)
