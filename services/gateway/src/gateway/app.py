"""The gateway's FastAPI app: settings, lifespan, middleware and error handlers around the routers of ``routes``.

``create_app(settings, sink=None, kafka=None, extensions=())``: with no ``sink`` the lifespan ensures the model-calls
topic and opens an ``eventbus.Producer`` on ``kafka`` (default ``KafkaSettings()`` from the environment); unit tests
pass a sink with ``async send(topic, event)`` instead. ``extensions`` run inside the lifespan after the proxy is up
(a gateway node passes its session runner there: ``sessions.gateway_node``). Everything the
routes need lives on ``app.state`` (``gateway``, ``registry``, ``settings``, ``metrics``); there are no module globals.

Routes: one router per provider of ``contracts.PROVIDERS`` (``gateway.routes.<name>``), then ``routes.admin``. The
app is a ``gateway.front.GatewayApp``: its front door strips session prefixes, refuses oversized bodies and serves
the provider calls past FastAPI's middleware stack (the hot path); everything else is plain FastAPI.
Errors: every exception becomes the error body of the provider whose paths it is on (``contracts.provider_for_path``:
``/v1/messages*`` Anthropic, ``/v1beta/*`` and ``/v1/models/*:*`` Google, else OpenAI); request validation errors
are 400s, unknown routes 404s, never a stack trace.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from contracts import MODEL_CALLS, PROVIDERS
from eventbus import KafkaSettings, Producer, ensure_topics
from gateway.core import Admission, Gateway
from gateway.errors import GatewayError, NotFound
from gateway.front import GatewayApp, error_response, invalid_request
from gateway.metrics import GatewayMetrics
from gateway.recorder import EventSink, Recorder
from gateway.registry import SessionRegistry
from gateway.routes import admin, provider_routes
from gateway.settings import GatewaySettings
from gateway.upstream import EngineClient

__all__ = ["LifespanExtension", "create_app", "record_producer_config"]

log = structlog.get_logger()

# Runs inside the app's lifespan once the proxy is ready (a gateway node's session runner, see ``sessions``); the app
# is passed so the extension can reach ``app.state.registry``. The gateway itself knows nothing of what it runs.
LifespanExtension = Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]


def record_producer_config(settings: GatewaySettings) -> dict[str, Any]:
    """What the gateway's producer changes in ``eventbus.producer_config``: no linger by default. Every call ends only
    once its record is acked, so the eventbus default (5 ms, right for services that produce off any request's path)
    was added to every call: measured with a real broker (``bench/gateway``'s Kafka columns), added latency p50
    7.4-7.6 ms with it, 1.6-2.0 ms without (docs/scaling.md). Records produced while a request to the broker is in
    flight are batched all the same."""
    return {"linger.ms": settings.record_linger_ms}


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
            stream_interval=settings.engine_stream_interval,
        )
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(engine.aclose)
            the_sink: EventSink | None = sink
            if the_sink is None:
                kafka_settings = kafka or KafkaSettings()
                await ensure_topics(kafka_settings, [MODEL_CALLS.with_name(settings.model_calls_topic)])
                the_sink = await stack.enter_async_context(
                    Producer(kafka_settings, config=record_producer_config(settings), registry=metrics.registry)
                )
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
    app = GatewayApp(title="floe gateway", version="0.1.0", lifespan=lifespan)
    app.max_body_bytes = settings.max_body_bytes
    app.state.settings = settings
    app.state.registry = SessionRegistry(settings.base_url(), default_ttl_s=settings.session_ttl_s)
    app.state.metrics = metrics

    @app.exception_handler(GatewayError)
    async def on_gateway_error(request: Request, exc: GatewayError) -> JSONResponse:
        return error_response(request.url.path, exc)

    @app.exception_handler(RequestValidationError)
    async def on_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(request.url.path, invalid_request(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 405:
            return error_response(
                request.url.path, NotFound(f"method {request.method} not allowed on {request.url.path}")
            )
        return error_response(request.url.path, NotFound(f"no route {request.method} {request.url.path}"))

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("unexpected_error", path=request.url.path, error=repr(exc))
        return error_response(request.url.path, GatewayError("internal gateway error"))

    for provider in PROVIDERS:
        app.include_router(provider_routes(provider).router)
    app.include_router(admin.router)
    return app
