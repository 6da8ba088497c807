"""``--engine vllm``: floe's inference service as a thin reverse proxy in front of vLLM, owning weight versions.

Role: ``create_vllm_app(settings)`` listens where the CPU engine would (``FLOE_INFERENCE_HOST``/``PORT``, model name
``policy``), so the gateway's configuration does not change. Its lifespan starts vLLM (``vllm_engine.VllmProcess``,
private on 127.0.0.1) or uses a running one (``FLOE_INFERENCE_VLLM_URL``), follows ``floe.weights`` with the CPU
engine's follower (``reloader.run_weight_follower``) and reloads vLLM in place (``vllm_weights.VllmWeights``).

Every response is stamped as the CPU engine stamps it: the ``x-floe-weight-version`` header; a top-level
``"weight_version"`` in JSON answers (chat, completions, ``/tokenize``, ``/detokenize``; each model of
``/v1/models``); and, in a stream, in the final chunk of a choice (``finish_reason`` set) and in the usage chunk.
The version is the one the request was admitted under, and a reload waits until no admitted request is left
(``vllm_weights``): it is the version of every token of that response.

Fast path: request bodies are forwarded as bytes, never parsed; a stream is relayed block by block, and only a
block holding a final or usage chunk is split into events, to insert ``"weight_version":N,`` after its ``{``. A
JSON answer gets the same insertion. Nothing is re-serialized.

Errors: vLLM's own errors pass through unchanged (status and body). vLLM unreachable: 503, silent for longer than
``FLOE_INFERENCE_VLLM_TIMEOUT_S``: 504; both name the URL, in the OpenAI error shape. A stream that breaks mid-way
ends with an ``{"error": ...}`` event (the gateway turns it into an upstream error). Once the weights are unknown
(``WeightsLostError``) every generation request gets a 503 and the service exits 1 (``/health`` says why).

Limits: only the routes the gateway uses are proxied (chat, completions, tokenize, detokenize, models, health);
vLLM's administrative endpoints stay private.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import structlog
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.types import Receive, Scope, Send

from eventbus import KafkaSettings, critical_failure, critical_task
from inference.errors import APIError
from inference.protocol import WEIGHT_VERSION_HEADER
from inference.reloader import WeightsLostError, read_version, run_weight_follower
from inference.settings import InferenceSettings
from inference.vllm_engine import VllmProcess, check_model_dir
from inference.vllm_weights import Admission, ReloadFailedError, VllmWeights

__all__ = ["create_vllm_app", "stamp_events", "stamp_json"]

log = structlog.get_logger()

# A choice's final chunk has a string finish_reason (others have null); the usage chunk has no choices. Both are
# matched on raw JSON: inside a JSON string every '"' is escaped, so these byte patterns cannot match content.
_STAMPED = re.compile(rb'"finish_reason":\s*"|"choices":\s*\[\s*\]')


def stamp_json(body: bytes, version: int) -> bytes:
    """``{"weight_version":N,`` + the rest of the object, byte for byte (JSON key order carries no meaning)."""
    start = body.find(b"{")
    if start < 0:
        return body
    rest = body[start + 1 :]
    sep = b"" if rest.lstrip().startswith(b"}") else b","
    return body[: start + 1] + b'"weight_version":%d' % version + sep + rest


def stamp_events(block: bytes, version: int) -> bytes:
    """Stamp the final and usage chunks among the whole SSE events of ``block``; other bytes are left as they are."""
    if _STAMPED.search(block) is None:
        return block
    events = block.split(b"\n\n")
    for i, event in enumerate(events):
        if event.startswith(b"data:") and _STAMPED.search(event):
            events[i] = stamp_json(event, version)
    return b"\n\n".join(events)


def _error_event(message: str) -> bytes:
    body = {"error": {"message": message, "type": "service_unavailable", "param": None, "code": None}}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


class _StreamRelay(StreamingResponse):
    """vLLM's SSE stream with the version stamped; at the end (or on disconnect) closes it and leaves the gate."""

    def __init__(self, upstream: httpx.Response, version: int, url: str, done: Callable[[], None]) -> None:
        self._upstream = upstream
        self._done = done
        headers = {WEIGHT_VERSION_HEADER: str(version), "cache-control": "no-cache"}
        content_type = upstream.headers.get("content-type", "text/event-stream")
        super().__init__(self._blocks(version, url), upstream.status_code, headers, media_type=content_type)

    async def _blocks(self, version: int, url: str) -> AsyncIterator[bytes]:
        pending = b""
        try:
            async for piece in self._upstream.aiter_bytes():
                if not pending and piece.endswith(b"\n\n"):  # the usual case: vLLM writes whole events
                    yield stamp_events(piece, version)
                    continue
                pending += piece  # an event split across reads waits here for its end
                end = pending.rfind(b"\n\n")
                if end >= 0:
                    block, pending = pending[: end + 2], pending[end + 2 :]
                    yield stamp_events(block, version)
        except httpx.HTTPError as exc:
            log.warning("vllm_stream_broken", url=url, error=repr(exc))
            yield _error_event(f"the stream from vLLM at {url} broke: {exc!r}")
            return
        if pending:
            yield stamp_events(pending, version)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            # Closing the upstream response aborts the request in vLLM if the client went away mid-stream.
            await self._upstream.aclose()
            self._done()


def _nothing() -> None:
    return None


class VllmProxy:
    """The routes' shared state: the client to vLLM, the gate and the weights (built in the lifespan)."""

    def __init__(self, client: httpx.AsyncClient, url: str, weights: VllmWeights, timeout_s: float) -> None:
        self.client = client
        self.url = url
        self.weights = weights
        self.admission = weights.admission
        self.timeout_s = timeout_s

    async def forward(self, request: Request, *, gated: bool) -> Response:
        """Send ``request`` to vLLM as is; relay its answer stamped with the version it was admitted under."""
        body = await request.body()
        done = _nothing
        if gated:
            try:
                await self.admission.enter()
            except WeightsLostError as exc:
                raise APIError(503, f"inference unavailable: {exc}", type="service_unavailable") from None
            done = self.admission.leave
        version = self.weights.version
        try:
            upstream = await self._send(request, body)
        except BaseException:
            done()
            raise
        if upstream.headers.get("content-type", "").startswith("text/event-stream"):
            return _StreamRelay(upstream, version, self.url, done)
        try:
            content = await self._read(upstream, request.url.path)
        finally:
            await upstream.aclose()
            done()
        content_type = upstream.headers.get("content-type", "application/json")
        if upstream.status_code == 200 and content_type.startswith("application/json"):
            content = stamp_json(content, version)
        headers = {WEIGHT_VERSION_HEADER: str(version)}
        return Response(content, upstream.status_code, headers, media_type=content_type)

    async def _send(self, request: Request, body: bytes) -> httpx.Response:
        headers = {"content-type": request.headers.get("content-type", "application/json")}
        path = request.url.path
        try:
            built = self.client.build_request(request.method, path, content=body, headers=headers)
            return await self.client.send(built, stream=True)
        except httpx.TimeoutException:
            raise self._timeout(path) from None
        except httpx.HTTPError as exc:
            raise APIError(
                503, f"vLLM at {self.url} is unreachable ({exc!r}) for {path}", type="service_unavailable"
            ) from None

    async def _read(self, upstream: httpx.Response, path: str) -> bytes:
        try:
            return await upstream.aread()
        except httpx.TimeoutException:
            raise self._timeout(path) from None
        except httpx.HTTPError as exc:
            raise APIError(
                503, f"vLLM at {self.url} broke off its answer to {path} ({exc!r})", type="service_unavailable"
            ) from None

    def _timeout(self, path: str) -> APIError:
        return APIError(
            504,
            f"vLLM at {self.url} sent nothing for {self.timeout_s:.0f} s on {path} (FLOE_INFERENCE_VLLM_TIMEOUT_S)",
            type="service_unavailable",
        )

    async def models(self, request: Request) -> Response:
        response = await self.forward(request, gated=False)
        if response.status_code != 200:
            return response
        version = self.weights.version
        data = json.loads(bytes(response.body))
        for model in data.get("data") or []:
            model["weight_version"] = version
        return JSONResponse(data, headers={WEIGHT_VERSION_HEADER: str(version)})

    async def health(self, app: FastAPI, consumer: str) -> JSONResponse:
        body: dict[str, Any] = {
            "status": "ok",
            "engine": "vllm",
            "vllm_url": self.url,
            "weight_version": self.weights.version,
            "weights_path": str(self.weights.path),
            "weights_consumer": consumer,
            "admitting": self.admission.is_open,
            "in_flight": self.admission.inside,
            "stats": dict(self.weights.stats),
        }
        error = critical_failure(app) or self.admission.failure
        if error is None:
            try:
                if (await self.client.get("/health", timeout=5.0)).status_code != 200:
                    error = f"vLLM at {self.url} is not healthy"
            except httpx.HTTPError as exc:
                error = f"vLLM at {self.url} is unreachable ({exc!r})"
        if error is not None:
            body["status"] = "failed"
            body["error"] = error
        return JSONResponse(body, status_code=200 if error is None else 503, headers=_version_header(body))


def _version_header(body: dict[str, Any]) -> dict[str, str]:
    return {WEIGHT_VERSION_HEADER: str(body["weight_version"])}


def create_vllm_app(settings: InferenceSettings | None = None, *, kafka: KafkaSettings | None = None) -> FastAPI:
    settings = settings or InferenceSettings()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        model_dir = check_model_dir(settings)
        async with contextlib.AsyncExitStack() as stack:
            process: VllmProcess | None = None
            if settings.vllm_url is None:
                process = await VllmProcess.start(settings)
                stack.push_async_callback(process.stop)
                url = process.url
            else:
                url = settings.vllm_url.rstrip("/")
            # httpx logs every request at INFO: one JSON line per proxied call would cost more than the proxying.
            logging.getLogger("httpx").setLevel(logging.WARNING)
            # No pool limit: every admitted request holds one connection for as long as it streams.
            client = httpx.AsyncClient(
                base_url=url,
                timeout=httpx.Timeout(settings.vllm_timeout_s, connect=5.0),
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
            )
            stack.push_async_callback(client.aclose)
            version = settings.weight_version if settings.weight_version is not None else read_version(model_dir) or 0
            weights = VllmWeights(
                client,
                url,
                Admission(),
                model_dir=model_dir,
                version=version,
                drain_timeout_s=settings.vllm_drain_timeout_s,
                reload_timeout_s=settings.vllm_reload_timeout_s,
            )
            try:
                await weights.sync()
            except ReloadFailedError as exc:
                if process is not None:
                    raise
                # A vLLM we did not start, down now: requests get a 503 naming it; the watch marks it once it is up
                # on its start weights (and refuses anything else).
                log.warning("vllm_sync_failed", url=url, error=str(exc))
            proxy = VllmProxy(client, url, weights, settings.vllm_timeout_s)
            app.state.proxy = proxy
            app.state.weights_ready = ready = _Ready(settings.consume_weights)
            tasks = [critical_task(app, weights.watch(settings.vllm_watch_s), "vllm weights watch")]
            if process is not None:
                tasks.append(critical_task(app, process.wait(), "vllm process"))
            if settings.consume_weights:
                follower = run_weight_follower(
                    weights,
                    kafka or KafkaSettings(),
                    topic_name=settings.weights_topic,
                    policy_name=settings.policy_name,
                    group_id=settings.weights_group_id,
                    ready=ready.event,
                    max_apply_s=weights.max_apply_s,
                )
                tasks.append(critical_task(app, follower, "weight follower"))
            log.info(
                "inference_ready",
                engine="vllm",
                vllm_url=url,
                model=settings.served_model_name,
                version=weights.version,
            )
            try:
                yield
            finally:
                for task in tasks:
                    task.cancel()
                for task in tasks:
                    with contextlib.suppress(BaseException):
                        await task

    app = FastAPI(title="floe inference (vLLM)", lifespan=lifespan)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        if exc.status >= 500:
            log.warning("vllm_proxy_error", status=exc.status, error=exc.message)
        version = str(request.app.state.proxy.weights.version)  # on every response, as the CPU engine does
        return JSONResponse(exc.body(), status_code=exc.status, headers={WEIGHT_VERSION_HEADER: version})

    def proxy(request: Request) -> VllmProxy:
        return request.app.state.proxy  # type: ignore[no-any-return]

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await proxy(request).forward(request, gated=True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await proxy(request).forward(request, gated=True)

    @app.post("/tokenize")
    async def tokenize(request: Request) -> Response:
        return await proxy(request).forward(request, gated=False)

    @app.post("/detokenize")
    async def detokenize(request: Request) -> Response:
        return await proxy(request).forward(request, gated=False)

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        return await proxy(request).models(request)

    @app.get("/health")
    async def health(request: Request) -> JSONResponse:
        return await proxy(request).health(request.app, request.app.state.weights_ready.state)

    return app


class _Ready:
    """The follower's readiness, as ``/health`` reports it for both engines: ready, starting or off."""

    def __init__(self, on: bool) -> None:
        self.on = on
        self.event = asyncio.Event()

    @property
    def state(self) -> str:
        return "ready" if self.event.is_set() else ("starting" if self.on else "off")
