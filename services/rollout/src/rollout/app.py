"""HTTP surface of the rollout service: ``GET /state`` (JSON for the dashboard), ``GET /metrics`` (Prometheus),
``GET /health``. The service itself runs as a background task owned by the app's lifespan.

Crash-only: if that task dies, ``/health`` answers 503 and ``python -m rollout`` stops its server and exits 1, so a
supervisor restarts it and it resumes from its committed offsets, instead of serving HTTP with a dead pipeline
behind it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from eventbus import KafkaSettings, critical_failure, critical_task
from rollout.service import RolloutService
from rollout.settings import RolloutSettings

__all__ = ["create_app"]


def create_app(settings: RolloutSettings, kafka: KafkaSettings | None = None, *, run_service: bool = True) -> FastAPI:
    service = RolloutService(settings, kafka or KafkaSettings())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        stop = asyncio.Event()
        task = critical_task(app, service.run(stop), "rollout pipeline") if run_service else None
        try:
            yield
        finally:
            stop.set()
            if task is not None and not task.done():
                try:
                    await asyncio.wait_for(task, timeout=10)
                except (TimeoutError, asyncio.CancelledError):
                    task.cancel()

    app = FastAPI(title="floe rollout", lifespan=lifespan)

    @app.get("/health")
    async def health() -> JSONResponse:
        """200 once the pipeline consumes; 503 while starting or after it died (with the reason)."""
        error = critical_failure(app)
        if error is not None:
            return JSONResponse({"status": "failed", "error": error}, status_code=503)
        if not service.ready.is_set():
            return JSONResponse({"status": "starting"}, status_code=503)
        return JSONResponse({"status": "ready"})

    @app.get("/state")
    async def state() -> dict[str, Any]:
        return service.snapshot()

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
