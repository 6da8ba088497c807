"""FastAPI app: routes of the OpenAI-compatible API, error mapping, lifespan (engine + weight reloader).

Role: ``create_app(settings)`` builds everything; handlers are thin and delegate to ``OpenAIServing``. Errors become
OpenAI-shaped JSON in one place: ``APIError`` -> its status, request validation -> 400, anything else -> 500 (logged).
Every response carries ``x-floe-weight-version``; generation responses report the version that produced them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import structlog
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse

from eventbus import KafkaSettings, critical_failure, critical_task
from inference.checkpoint import init_dev_model, load_checkpoint
from inference.engine import Engine, EngineClosedError
from inference.errors import APIError
from inference.protocol import (
    WEIGHT_VERSION_HEADER,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from inference.reloader import run_weight_follower
from inference.serving import OpenAIServing, Stream, api_error_from
from inference.settings import InferenceSettings

__all__ = ["WEIGHT_VERSION_HEADER", "create_app"]

log = structlog.get_logger()


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    first = errors[0]
    if first.get("type") == "json_invalid":
        return f"request body is not valid JSON: {first.get('ctx', {}).get('error', 'parse error')}", None
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    return f"{first.get('msg', 'invalid value')}" + (f" (at `{param}`)" if param else ""), param


def create_app(settings: InferenceSettings | None = None, *, kafka: KafkaSettings | None = None) -> FastAPI:
    settings = settings or InferenceSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        model_dir = settings.model_dir
        if not (model_dir / "config.json").exists():
            if not settings.init_if_missing:
                raise FileNotFoundError(f"no checkpoint at {model_dir}")
            log.info("dev_model_init", path=str(model_dir))
            await asyncio.to_thread(init_dev_model, model_dir)
        checkpoint = await asyncio.to_thread(load_checkpoint, model_dir, version=settings.weight_version)
        engine = Engine(
            checkpoint,
            max_batch=settings.max_batch,
            batch_wait_s=settings.batch_wait_ms / 1000,
            prefill_chunk=settings.prefill_chunk,
            max_model_len=settings.max_model_len,
            threads=settings.threads,
            seed=settings.seed,
        )
        engine.start()
        app.state.engine = engine
        app.state.serving = OpenAIServing(engine, settings)
        app.state.weights_ready = asyncio.Event()
        reloader: asyncio.Task[None] | None = None
        if settings.consume_weights:
            # An engine that silently stopped following WeightsPublished would serve stale weights forever.
            reloader = critical_task(
                app,
                run_weight_follower(
                    engine,
                    kafka or KafkaSettings(),
                    topic_name=settings.weights_topic,
                    policy_name=settings.policy_name,
                    group_id=settings.weights_group_id,
                    ready=app.state.weights_ready,
                ),
                "weight reloader",
            )
        log.info(
            "inference_ready",
            model=settings.served_model_name,
            version=engine.version,
            max_model_len=engine.max_model_len,
            path=str(model_dir),
        )
        try:
            yield
        finally:
            if reloader is not None:
                reloader.cancel()
                await asyncio.gather(reloader, return_exceptions=True)
            await asyncio.to_thread(engine.stop)

    app = FastAPI(title="floe inference", lifespan=lifespan)

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return JSONResponse(APIError(400, message, param=param).body(), status_code=400)

    @app.exception_handler(EngineClosedError)
    async def _closed(_: Request, exc: EngineClosedError) -> JSONResponse:
        err = APIError(503, str(exc), type="service_unavailable")
        return JSONResponse(err.body(), status_code=503)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled_error", error=str(exc))
        err = api_error_from(exc)
        return JSONResponse(err.body(), status_code=err.status)

    @app.middleware("http")
    async def _version_header(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        response = await call_next(request)
        if WEIGHT_VERSION_HEADER not in response.headers and hasattr(request.app.state, "engine"):
            response.headers[WEIGHT_VERSION_HEADER] = str(request.app.state.engine.version)
        return response

    def serving(request: Request) -> OpenAIServing:
        return request.app.state.serving  # type: ignore[no-any-return]

    def respond(result: dict[str, Any] | Stream) -> Response:
        if isinstance(result, Stream):
            return StreamingResponse(
                result.lines,
                media_type="text/event-stream",
                headers={WEIGHT_VERSION_HEADER: str(result.version), "cache-control": "no-cache"},
            )
        return Response(
            json.dumps(result, ensure_ascii=False),
            media_type="application/json",
            headers={WEIGHT_VERSION_HEADER: str(result["weight_version"])},
        )

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return respond(await serving(request).chat(body))

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return respond(await serving(request).completions(body))

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        return serving(request).models()

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest, request: Request) -> dict[str, Any]:
        return serving(request).tokenize(body)

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest, request: Request) -> dict[str, Any]:
        return serving(request).detokenize(body)

    @app.get("/health")
    async def health(request: Request) -> JSONResponse:
        engine: Engine = request.app.state.engine
        ready: asyncio.Event = request.app.state.weights_ready
        failure = critical_failure(request.app)
        body: dict[str, Any] = {
            "status": "ok" if failure is None else "failed",
            "weight_version": engine.version,
            "queue_depth": engine.queue_depth(),
            "weights_consumer": "ready" if ready.is_set() else ("off" if not settings.consume_weights else "starting"),
            "stats": dict(engine.stats),
        }
        if failure is not None:
            body["error"] = failure
        return JSONResponse(body, status_code=200 if failure is None else 503)

    return app
