"""Where a call's session token comes from, and which provider's error shape a path speaks.

Token sources, first match wins: the URL prefix ``/s/{token}/...`` (stripped by ``SessionPrefixMiddleware`` before
routing), ``x-api-key``, ``x-goog-api-key``, ``Authorization: Bearer``, the ``key`` query parameter. Nothing in the
body is trusted for identity.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.errors import Provider

__all__ = ["SessionPrefixMiddleware", "presented_token", "provider_for_path"]


def provider_for_path(path: str) -> Provider:
    if path.startswith("/v1/messages"):
        return "anthropic"
    if path.startswith("/v1beta") or (path.startswith("/v1/models/") and ":" in path):
        return "google"
    return "openai"


class SessionPrefixMiddleware:
    """Rewrites ``/s/{token}/rest`` to ``/rest`` and keeps the token in ``scope["state"]["session_token"]``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/s/"):
            parts = scope["path"].split("/", 3)  # ["", "s", token, rest]
            if len(parts) >= 3 and parts[2]:
                rest = "/" + (parts[3] if len(parts) == 4 else "")
                scope = dict(scope)
                scope["path"] = rest
                scope["raw_path"] = rest.encode()
                state = dict(scope.get("state") or {})
                state["session_token"] = parts[2]
                scope["state"] = state
        await self.app(scope, receive, send)


def presented_token(request: Request) -> str | None:
    token = getattr(request.state, "session_token", None)
    if token:
        return str(token)
    for header in ("x-api-key", "x-goog-api-key"):
        value = request.headers.get(header)
        if value:
            return value.strip()
    auth = request.headers.get("authorization", "")
    if auth[:7].lower() == "bearer " and auth[7:].strip():
        return auth[7:].strip()
    key = request.query_params.get("key")
    return key or None
