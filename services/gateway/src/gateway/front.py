"""The gateway's front door: what every HTTP request goes through first, and the fast lane of the provider calls.

Every request: the log context of the previous one is cleared, a ``/s/{token}/`` prefix is stripped into
``scope["state"]["session_token"]`` (``gateway.auth.strip_session_prefix``), and a declared body above
``max_body_bytes`` gets the provider's 413 before anything is read.

Then a provider *call* (a POST route of a provider router whose endpoint takes a validated ``body``: chat
completions, responses, messages, generateContent, the token counts) runs straight from here: its body is validated by
the route's own pydantic model (``model_validate_json``, one pass in Rust) and the same endpoint function is awaited.
Why: FastAPI's stack (ServerError, exception, body-limit and exit-stack middleware, the router, dependency solving)
is ~20 coroutine frames that every request and every resumption of a streaming call passes through; measured
(``bench/gateway``), it was ~0.5 ms of the gateway's CPU per call. The routes stay declared once, on their
``APIRouter`` (so the OpenAPI document and the fuzz test still see them); this lane is derived from them. Errors
render exactly as the app's exception handlers render them (``errors.render`` with the provider of the path).
Everything else (admin, model lists, health, metrics, unknown paths) goes on to FastAPI.
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from contracts import PROVIDERS, provider_for_path
from gateway.auth import strip_session_prefix
from gateway.errors import GatewayError, InvalidRequest, PayloadTooLarge, render
from gateway.responses import json_response
from gateway.routes import provider_routes

__all__ = ["GatewayApp", "error_response", "invalid_request"]

log = structlog.get_logger()

# Built once: every error response looks its provider's body up here by path.
_ERROR_BODIES = {p.name: provider_routes(p).error_body for p in PROVIDERS}


def error_response(path: str, err: GatewayError) -> JSONResponse:
    status, body, headers = render(_ERROR_BODIES[provider_for_path(path).name], err)
    return JSONResponse(body, status_code=status, headers=headers)


def invalid_request(errors: Sequence[Any]) -> InvalidRequest:
    """The 400 of a body that failed validation, from pydantic's (or FastAPI's, ``body``-prefixed) error list."""
    first = errors[0] if errors else {}
    loc = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
    msg = f"{loc}: {first.get('msg', 'invalid request')}" if loc else str(first.get("msg", "invalid request"))
    if first.get("type") == "json_invalid":
        msg = "request body is not valid JSON"
    return InvalidRequest(msg, param=loc or None)


@dataclass(frozen=True)
class _Call:
    """One provider call route of the fast lane: its path pattern, body model and endpoint."""

    regex: re.Pattern[str]
    literal: str | None  # the path when it has no parameters (a dict lookup, no regex)
    model: type[BaseModel]
    endpoint: Callable[..., Awaitable[Any]]
    params: tuple[str, ...]  # path parameters the endpoint takes by name


def _calls() -> list[_Call]:
    """The fast lane's routes: the provider routers' POST routes with a pydantic ``body`` (mounted without a prefix)."""
    calls: list[_Call] = []
    for provider in PROVIDERS:
        for route in provider_routes(provider).router.routes:
            if not (isinstance(route, APIRoute) and "POST" in (route.methods or ())):
                continue
            body = typing.get_type_hints(route.endpoint).get("body")
            if not (inspect.isclass(body) and issubclass(body, BaseModel)):
                continue
            names = tuple(inspect.signature(route.endpoint).parameters)
            path_params = set(route.param_convertors or ())
            if not set(names) <= {"request", "body", *path_params}:
                continue  # takes something only FastAPI's dependency solver provides: leave it to FastAPI
            literal = route.path if not route.param_convertors else None
            params = tuple(n for n in names if n in path_params)
            calls.append(_Call(route.path_regex, literal, body, route.endpoint, params))
    return calls


class GatewayApp(FastAPI):
    """FastAPI behind the front door (see the module docstring); ``max_body_bytes`` is set by ``create_app``."""

    max_body_bytes: int = 32 * 1024 * 1024
    _literal: dict[str, _Call] | None = None  # with _patterned: derived on the first request, when routes are complete
    _patterned: tuple[_Call, ...] = ()

    def _lane(self, path: str) -> tuple[_Call, dict[str, str]] | None:
        if self._literal is None:
            calls = _calls()
            self._literal = {c.literal: c for c in calls if c.literal is not None}
            self._patterned = tuple(c for c in calls if c.literal is None)
        call = self._literal.get(path)
        if call is not None:
            return call, {}
        for call in self._patterned:
            m = call.regex.match(path)
            if m is not None:
                return call, m.groupdict()
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        structlog.contextvars.clear_contextvars()
        scope = strip_session_prefix(scope)
        path = scope["path"]
        length = next((v for k, v in scope.get("headers") or () if k == b"content-length"), b"")
        if length.isdigit() and int(length) > self.max_body_bytes:
            err = PayloadTooLarge(f"request body above {self.max_body_bytes} bytes")
            await error_response(path, err)(scope, receive, send)
            return
        lane = self._lane(path) if scope["method"] == "POST" else None
        if lane is None:
            await super().__call__(scope, receive, send)
            return
        call, params = lane
        scope["app"] = self  # what Request.app (and so every handler's app.state) reads
        try:
            raw = await self._body(receive)
            if raw is None:
                return  # the client left before its body arrived
            try:
                body = call.model.model_validate_json(raw)
            except ValidationError as exc:
                raise invalid_request(exc.errors()) from exc
            kwargs: dict[str, Any] = {"request": Request(scope, receive), "body": body}
            kwargs.update((name, params[name]) for name in call.params)
            result = await call.endpoint(**kwargs)
            response = result if isinstance(result, Response) else json_response(result)
        except GatewayError as err:
            response = error_response(path, err)
        except Exception as exc:  # the app's on_unexpected handler, for this lane
            log.error("unexpected_error", path=path, error=repr(exc))
            response = error_response(path, GatewayError("internal gateway error"))
        await response(scope, receive, send)

    async def _body(self, receive: Receive) -> bytes | None:
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            part = message.get("body", b"")
            size += len(part)
            if size > self.max_body_bytes:  # a chunked upload declares no length
                raise PayloadTooLarge(f"request body above {self.max_body_bytes} bytes")
            parts.append(part)
            if not message.get("more_body"):
                return b"".join(parts)
