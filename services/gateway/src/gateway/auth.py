"""Where a call's session token comes from.

Token sources, first match wins: the URL prefix ``/s/{token}/...`` (stripped by ``strip_session_prefix`` in the
front door, ``gateway.front``, before routing), the providers' key headers (``x-api-key``, ``x-goog-api-key``),
``Authorization: Bearer``, their query parameters (``key``); the headers and parameters are those of
``contracts.PROVIDERS``. Any source is accepted on any path: the token, not the path, names the session. Nothing in
the body is trusted for identity.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.types import Scope

from contracts import PROVIDERS

__all__ = ["presented_token", "strip_session_prefix"]

# Vendor key headers before the generic Bearer header (the order these sources have always had).
_KEY_HEADERS = tuple(dict.fromkeys(p.key_header for p in PROVIDERS if p.key_header != "authorization"))
_KEY_QUERY = tuple(dict.fromkeys(p.key_query for p in PROVIDERS if p.key_query))
_KEY_HEADERS_RAW = tuple(h.lower().encode("latin-1") for h in _KEY_HEADERS)
_WANTED = frozenset((*_KEY_HEADERS_RAW, b"authorization"))


def strip_session_prefix(scope: Scope) -> Scope:
    """``/s/{token}/rest`` becomes ``/rest``, the token kept in ``scope["state"]["session_token"]`` (a new scope)."""
    if scope["path"].startswith("/s/"):
        parts = scope["path"].split("/", 3)  # ["", "s", token, rest]
        if len(parts) >= 3 and parts[2]:
            rest = "/" + (parts[3] if len(parts) == 4 else "")
            scope = dict(scope)
            scope["path"] = rest
            scope["raw_path"] = rest.encode()
            state = dict(scope.get("state") or {})
            state["session_token"] = parts[2]
            scope["state"] = state
    return scope


def presented_token(request: Request) -> str | None:
    state = request.scope.get("state")
    token = state.get("session_token") if state else None
    if token:
        return str(token)
    # One pass over the raw headers (ASGI names them in lower case), the first of each name as Headers.get finds it:
    # every call asks, and Headers would scan the whole list once per name.
    found: dict[bytes, bytes] = {}
    for name, raw in request.scope.get("headers") or ():
        if name in _WANTED and name not in found:
            found[name] = raw
    for header in _KEY_HEADERS_RAW:
        value = found.get(header)
        if value:
            return value.decode("latin-1").strip()
    auth = found.get(b"authorization", b"").decode("latin-1")
    if auth[:7].lower() == "bearer " and auth[7:].strip():
        return auth[7:].strip()
    for param in _KEY_QUERY:
        key = request.query_params.get(param)
        if key:
            return key
    return None
