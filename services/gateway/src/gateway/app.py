"""The gateway's FastAPI app: provider routes (parse -> ``Turn`` -> render), admin, health and metrics.

``create_app(settings, sink=None, kafka=None, extensions=())``: with no ``sink`` the lifespan ensures the model-calls
topic and opens an ``eventbus.Producer`` on ``kafka`` (default ``KafkaSettings()`` from the environment); unit tests
pass a sink with ``async send(topic, event)`` instead. ``extensions`` run inside the lifespan after the proxy is up
(a gateway node passes its session runner there: ``sessions.gateway_node``). Everything the
routes need lives on ``app.state`` (``gateway``, ``registry``, ``metrics``); there are no module globals.

Errors: every exception becomes the provider's own error body (by path: ``/v1/messages*`` Anthropic,
``/v1beta/*`` Google, else OpenAI); request validation errors are 400s, unknown routes 404s, never a stack trace.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from contracts import MODEL_CALLS, SamplingPolicy, TokenizationMode
from eventbus import KafkaSettings, Producer, critical_failure, ensure_topics
from gateway.auth import SessionPrefixMiddleware, presented_token, provider_for_path
from gateway.canonical import CanonicalRequest
from gateway.core import Admission, Gateway, Turn
from gateway.errors import (
    Forbidden,
    GatewayError,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    Unauthenticated,
    render,
)
from gateway.metrics import GatewayMetrics
from gateway.protocols import anthropic_messages, google_generate, openai_chat, openai_responses
from gateway.protocols.sse import SSE_HEADERS
from gateway.recorder import EventSink, Recorder
from gateway.registry import Session, SessionRegistry
from gateway.settings import GatewaySettings
from gateway.upstream import EngineClient

__all__ = ["LifespanExtension", "create_app"]

log = structlog.get_logger()


class CreateSession(BaseModel):
    session_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
    group_id: str = Field(default="", max_length=128)
    tokenization: TokenizationMode | None = None
    sampling: SamplingPolicy | None = None
    model: str = "floe-policy"
    ttl_s: float | None = Field(default=None, gt=0)


class PauseRequest(BaseModel):
    timeout_s: float | None = Field(default=None, ge=0)


def _gw(request: Request) -> Gateway:
    gw: Gateway = request.app.state.gateway
    return gw


def _session(request: Request, model: str | None) -> Session:
    registry: SessionRegistry = request.app.state.registry
    try:
        session = registry.resolve(presented_token(request))
    except Unauthenticated as exc:
        _gw(request).metrics.rejected.labels(reason=exc.reason).inc()
        log.warning("credentials_rejected", reason=exc.reason, path=request.url.path)
        raise
    settings = _gw(request).settings
    if settings.strict_models and model is not None and model not in {session.model, *settings.model_aliases}:
        raise NotFound(f"model {model!r} does not exist")
    structlog.contextvars.bind_contextvars(session_id=session.session_id)
    return session


async def _prompt_tokens(request: Request, session: Session, canon: CanonicalRequest) -> int:
    """Prompt tokens of a request as the engine's chat template renders it (count-tokens endpoints; no call made)."""
    kw = {"enable_thinking": canon.thinking} if canon.thinking is not None else None
    tok = await _gw(request).engine.tokenize_chat(
        session.session_id,
        [m.to_engine() for m in canon.messages],
        [t.to_engine() for t in canon.tools],
        add_generation_prompt=True,
        chat_template_kwargs=kw,
    )
    return len(tok.tokens)


def _admin(request: Request) -> None:
    expected = _gw(request).settings.control_token
    auth = request.headers.get("authorization", "")
    if expected is None or auth != f"Bearer {expected.get_secret_value()}":
        raise Forbidden("admin routes need the control token")


async def _run(
    request: Request, canon: CanonicalRequest, protocol_mod: Any, session: Session, stream_fn: Any
) -> Response:
    turn = Turn(_gw(request), session, canon, protocol_mod.PROTOCOL)
    await turn.start()
    if canon.stream:
        return StreamingResponse(stream_fn(turn), media_type="text/event-stream", headers=SSE_HEADERS)
    async for _ in turn.events():
        pass
    return JSONResponse(protocol_mod.render_json(turn.result))


def _error_response(request: Request, err: GatewayError) -> JSONResponse:
    status, body, headers = render(provider_for_path(request.url.path), err)
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
                status, body, headers = render(provider_for_path(scope["path"]), err)
                await JSONResponse(body, status_code=status, headers=headers)(scope, receive, send)
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
    app.state.registry = SessionRegistry(settings.base_url(), default_ttl_s=settings.session_ttl_s)
    app.state.metrics = metrics

    app.add_middleware(_BodyLimit, max_body_bytes=settings.max_body_bytes)
    app.add_middleware(SessionPrefixMiddleware)  # outermost: paths are rewritten before anything else sees them

    @app.exception_handler(GatewayError)
    async def on_gateway_error(request: Request, exc: GatewayError) -> JSONResponse:
        return _error_response(request, exc)

    @app.exception_handler(RequestValidationError)
    async def on_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errs = exc.errors()
        first = errs[0] if errs else {}
        loc = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        msg = f"{loc}: {first.get('msg', 'invalid request')}" if loc else str(first.get("msg", "invalid request"))
        if first.get("type") == "json_invalid":
            msg = "request body is not valid JSON"
        return _error_response(request, InvalidRequest(msg, param=loc or None))

    @app.exception_handler(StarletteHTTPException)
    async def on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 405:
            return _error_response(request, NotFound(f"method {request.method} not allowed on {request.url.path}"))
        return _error_response(request, NotFound(f"no route {request.method} {request.url.path}"))

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("unexpected_error", path=request.url.path, error=repr(exc))
        return _error_response(request, GatewayError("internal gateway error"))

    # ------------------------------------------------------------------------------------------- OpenAI

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request, body: openai_chat.ChatRequest) -> Response:
        session = _session(request, body.model)
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return await _run(
            request,
            openai_chat.to_canonical(body),
            openai_chat,
            session,
            lambda t: openai_chat.stream(t, include_usage),
        )

    @app.post("/v1/responses")
    async def responses(request: Request, body: openai_responses.ResponsesRequest) -> Response:
        session = _session(request, body.model)
        canon = openai_responses.to_canonical(body)
        return await _run(request, canon, openai_responses, session, lambda t: openai_responses.stream(t, body))

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        session = _session(request, None)
        names = dict.fromkeys([session.model, *settings.model_aliases])
        return {
            "object": "list",
            "data": [{"id": n, "object": "model", "created": int(time.time()), "owned_by": "floe"} for n in names],
        }

    # ------------------------------------------------------------------------------------------- Anthropic

    @app.post("/v1/messages")
    async def messages(request: Request, body: anthropic_messages.MessagesRequest) -> Response:
        session = _session(request, body.model)
        return await _run(
            request, anthropic_messages.to_canonical(body), anthropic_messages, session, anthropic_messages.stream
        )

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request, body: anthropic_messages.CountTokensRequest) -> dict[str, int]:
        session = _session(request, body.model)
        return {"input_tokens": await _prompt_tokens(request, session, anthropic_messages.to_canonical(body))}

    # ------------------------------------------------------------------------------------------- Google

    @app.post("/v1beta/models/{model}:generateContent")
    @app.post("/v1/models/{model}:generateContent")
    async def generate_content(request: Request, model: str, body: google_generate.GenerateRequest) -> Response:
        session = _session(request, model)
        canon = google_generate.to_canonical(body, model, stream=False)
        return await _run(request, canon, google_generate, session, None)

    @app.post("/v1beta/models/{model}:countTokens")
    @app.post("/v1/models/{model}:countTokens")
    async def count_tokens_google(
        request: Request, model: str, body: google_generate.CountTokensRequest
    ) -> dict[str, int]:
        session = _session(request, model)
        canon = google_generate.to_canonical(body.as_generate(), model, stream=False)
        return {"totalTokens": await _prompt_tokens(request, session, canon)}

    @app.post("/v1beta/models/{model}:streamGenerateContent")
    @app.post("/v1/models/{model}:streamGenerateContent")
    async def stream_generate_content(request: Request, model: str, body: google_generate.GenerateRequest) -> Response:
        session = _session(request, model)
        canon = google_generate.to_canonical(body, model, stream=True)
        sse_mode = request.query_params.get("alt") == "sse"
        turn = Turn(_gw(request), session, canon, google_generate.PROTOCOL)
        await turn.start()
        media = "text/event-stream" if sse_mode else "application/json"
        return StreamingResponse(google_generate.stream(turn, sse_mode), media_type=media, headers=SSE_HEADERS)

    # ------------------------------------------------------------------------------------------- admin

    @app.post("/admin/sessions")
    async def create_session(request: Request, body: CreateSession) -> dict[str, Any]:
        _admin(request)
        creds = app.state.registry.create(
            body.session_id,
            body.group_id or body.session_id,
            body.tokenization or settings.default_tokenization,
            body.sampling or settings.default_sampling,
            body.model,
            body.ttl_s,
        )
        return dict(creds.as_json())

    @app.get("/admin/sessions/{session_id}")
    async def session_stats(request: Request, session_id: str) -> dict[str, Any]:
        _admin(request)
        stats = app.state.registry.stats(session_id)
        if not stats:
            raise NotFound(f"no session {session_id!r}")
        return {"session_id": session_id, **stats}

    @app.delete("/admin/sessions/{session_id}")
    async def close_session(request: Request, session_id: str) -> dict[str, Any]:
        _admin(request)
        if not app.state.registry.close(session_id):
            raise NotFound(f"no session {session_id!r}")
        return {"session_id": session_id, "closed": True}

    @app.post("/admin/pause")
    async def pause(request: Request, body: PauseRequest | None = None) -> dict[str, Any]:
        _admin(request)
        gw = _gw(request)
        timeout = body.timeout_s if body and body.timeout_s is not None else settings.pause_timeout_s
        t0 = time.perf_counter()
        drained = await gw.admission.pause(timeout)
        return {
            "paused": True,
            "drained": drained,
            "inflight": gw.admission.inflight,
            "drain_seconds": round(time.perf_counter() - t0, 4),
        }

    @app.post("/admin/resume")
    async def resume(request: Request) -> dict[str, Any]:
        _admin(request)
        _gw(request).admission.resume()
        return {"paused": False}

    @app.get("/health")  # the name every other floe service uses
    @app.get("/healthz")
    async def healthz(request: Request) -> JSONResponse:
        gw = _gw(request)
        failure = critical_failure(request.app)
        body: dict[str, Any] = {
            "ok": failure is None,
            "paused": gw.admission.paused,
            "inflight": gw.admission.inflight,
            "records_pending": gw.recorder.pending,
        }
        if failure is not None:
            body["error"] = failure
        return JSONResponse(body, status_code=200 if failure is None else 503)

    @app.get("/metrics")
    async def metrics_route() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.head("/")
    async def head_root() -> Response:
        return Response(status_code=200)

    return app
