"""The gateway's FastAPI app: settings, lifespan, middleware and error handlers around the routers of ``routes``.

``create_app(settings, sink=None, kafka=None, extensions=())``: with no ``sink`` the lifespan ensures the model-calls
topic and opens an ``eventbus.Producer`` on ``kafka`` (default ``KafkaSettings()`` from the environment); unit tests
pass a sink with ``async send(topic, event)`` instead. ``extensions`` run inside the lifespan after the proxy is up
(a gateway node passes its session runner there: ``sessions.gateway_node``). Everything the
routes need lives on ``app.state`` (``gateway``, ``registry``, ``settings``, ``metrics``); there are no module globals.

Routes: one router per provider of ``contracts.PROVIDERS`` (``gateway.routes.<name>``), then ``routes.admin``.
Errors: every exception becomes the error body of the provider whose paths it is on (``contracts.provider_for_path``:
``/v1/messages*`` Anthropic, ``/v1beta/*`` and ``/v1/models/*:*`` Google, else OpenAI); request validation errors
are 400s, unknown routes 404s, never a stack trace.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Sequence

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from contracts import MODEL_CALLS, PROVIDERS, provider_for_path
from eventbus import KafkaSettings, Producer, ensure_topics
from gateway.auth import SessionPrefixMiddleware
from gateway.core import Admission, Gateway
from gateway.errors import GatewayError, InvalidRequest, NotFound, PayloadTooLarge, render
from gateway.metrics import GatewayMetrics
from gateway.recorder import EventSink, Recorder
from gateway.registry import SessionRegistry
from gateway.routes import admin, provider_routes
from gateway.settings import GatewaySettings
from gateway.upstream import EngineClient

__all__ = ["LifespanExtension", "create_app"]

log = structlog.get_logger()

# Built once: every error response looks its provider's body up here by path.
_ERROR_BODIES = {p.name: provider_routes(p).error_body for p in PROVIDERS}


def _error_response(path: str, err: GatewayError) -> JSONResponse:
    status, body, headers = render(_ERROR_BODIES[provider_for_path(path).name], err)
    return JSONResponse(body, status_code=status, headers=headers)


class _BodyLimit:
    """Pure ASGI (no ``BaseHTTPMiddleware``: it re-wraps every streamed response): a declared body above the limit
    gets the provider's 413 before anything is read; clears the log context of the previous request."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            structlog.contextvars.clear_contextvars()
            length = dict(scope.get("headers") or []).get(b"content-length", b"")
            if length.isdigit() and int(length) > self.max_body_bytes:
                err = PayloadTooLarge(f"request body above {self.max_body_bytes} bytes")
                await _error_response(scope["path"], err)(scope, receive, send)
                return
        await self.app(scope, receive, send)


# Runs inside the app's lifespan once the proxy is ready (a gateway node's session runner, see ``sessions``); the app
# is passed so the extension can reach ``app.state.registry``. The gateway itself knows nothing of what it runs.
LifespanExtension = Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]


def create_app(
    settings: GatewaySettings | None = None,
    *,
    sink: EventSink | None = None,
    kafka: KafkaSettings | None = None,
    extensions: Sequence[LifespanExtension] = (),
) -> FastAPI:
    settings = settings or GatewaySettings()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = EngineClient(
            settings.engine_urls,
            model=settings.engine_model,
            timeout_s=settings.engine_timeout_s,
            connect_timeout_s=settings.engine_connect_timeout_s,
            unhealthy_s=settings.engine_unhealthy_s,
        )
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(engine.aclose)
            the_sink: EventSink | None = sink
            if the_sink is None:
                kafka_settings = kafka or KafkaSettings()
                await ensure_topics(kafka_settings, [MODEL_CALLS.with_name(settings.model_calls_topic)])
                the_sink = await stack.enter_async_context(Producer(kafka_settings, registry=metrics.registry))
            assert the_sink is not None
            recorder = Recorder(
                the_sink,
                topic_name=settings.model_calls_topic,
                metrics=metrics,
                max_pending=settings.max_pending_records,
                timeout_s=settings.record_timeout_s,
                retry_after_s=settings.retry_after_s,
            )
            app.state.gateway = Gateway(settings, engine, recorder, metrics, Admission(settings.retry_after_s))
            log.info("gateway_started", engines=settings.engine_urls, topic=settings.model_calls_topic)
            for extension in extensions:
                await stack.enter_async_context(extension(app))
            yield

    metrics = GatewayMetrics()
    app = FastAPI(title="floe gateway", version="0.1.0", lifespan=lifespan)
    app.state.settings = settings
    app.state.registry = SessionRegistry(settings.base_url(), default_ttl_s=settings.session_ttl_s)
    app.state.metrics = metrics

    app.add_middleware(_BodyLimit, max_body_bytes=settings.max_body_bytes)
    app.add_middleware(SessionPrefixMiddleware)  # outermost: paths are rewritten before anything else sees them

    @app.exception_handler(GatewayError)
    async def on_gateway_error(request: Request, exc: GatewayError) -> JSONResponse:
        return _error_response(request.url.path, exc)

    @app.exception_handler(RequestValidationError)
    async def on_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errs = exc.errors()
        first = errs[0] if errs else {}
        loc = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        msg = f"{loc}: {first.get('msg', 'invalid request')}" if loc else str(first.get("msg", "invalid request"))
        if first.get("type") == "json_invalid":
            msg = "request body is not valid JSON"
        return _error_response(request.url.path, InvalidRequest(msg, param=loc or None))

    @app.exception_handler(StarletteHTTPException)
    async def on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 405:
            return _error_response(
                request.url.path, NotFound(f"method {request.method} not allowed on {request.url.path}")
            )
        return _error_response(request.url.path, NotFound(f"no route {request.method} {request.url.path}"))

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("unexpected_error", path=request.url.path, error=repr(exc))
        return _error_response(request.url.path, GatewayError("internal gateway error"))

    for provider in PROVIDERS:
        app.include_router(provider_routes(provider).router)
    app.include_router(admin.router)
    return app
