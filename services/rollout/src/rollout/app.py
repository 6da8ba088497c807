"""HTTP surface of the rollout service: ``GET /state`` (JSON for the dashboard), ``GET /metrics`` (Prometheus),
``GET /health``. The service itself runs as a background task owned by the app's lifespan."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from eventbus import KafkaSettings
from rollout.service import RolloutService
from rollout.settings import RolloutSettings

__all__ = ["create_app"]


def create_app(settings: RolloutSettings, kafka: KafkaSettings | None = None, *, run_service: bool = True) -> FastAPI:
    service = RolloutService(settings, kafka or KafkaSettings())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        stop = asyncio.Event()
        task = asyncio.create_task(service.run(stop)) if run_service else None
        app.state.service, app.state.task = service, task
        try:
            yield
        finally:
            stop.set()
            if task is not None:
                try:
                    await asyncio.wait_for(task, timeout=10)
                except (TimeoutError, asyncio.CancelledError):
                    task.cancel()

    app = FastAPI(title="floe rollout", lifespan=lifespan)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        task = app.state.task
        failed = task is not None and task.done() and not task.cancelled() and task.exception() is not None
        return {"status": "failed" if failed else ("ready" if service.ready.is_set() else "starting")}

    @app.get("/state")
    async def state() -> dict[str, Any]:
        return service.snapshot()

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
