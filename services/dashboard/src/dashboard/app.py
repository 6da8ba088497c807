"""The dashboard web app: ``/`` (the page), ``/api/state`` (the JSON snapshot it polls), ``/health``.

A background task consumes the run's topics into a ``DashboardState``. The consumer never blocks the page: a broker
outage only freezes the numbers (the page shows when it last updated).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any

import structlog
from fastapi import FastAPI
from fastapi.responses import HTMLResponse

from contracts import (
    MODEL_CALLS,
    REWARDS,
    SESSIONS_FINISHED,
    SESSIONS_REQUESTED,
    SESSIONS_STATE,
    TRAJECTORY_BATCHES,
    WEIGHTS,
    Topic,
)
from dashboard.settings import DashboardSettings
from dashboard.state import DashboardState
from eventbus import Consumer, KafkaSettings
from eventbus.aio_consumer import AioConsumer

__all__ = ["DEFAULT_TOPICS", "create_app"]

log = structlog.get_logger()

DEFAULT_TOPICS: tuple[Topic[Any], ...] = (
    SESSIONS_REQUESTED,  # eval rounds (metadata) and which sessions are eval
    SESSIONS_STATE,
    SESSIONS_FINISHED,
    MODEL_CALLS,
    REWARDS,
    TRAJECTORY_BATCHES,
    WEIGHTS,
)


async def _follow(
    kafka: KafkaSettings, topics: tuple[Topic[Any], ...], group: str, state: DashboardState, client: str
) -> None:
    while True:
        try:
            consumer: Consumer[Any] | AioConsumer[Any] = (
                AioConsumer(kafka, list(topics), group_id=group)
                if client == "aiokafka"
                else Consumer(kafka, list(topics), group_id=group)
            )
            async with consumer:
                async for msg in consumer:
                    state.apply(msg.event)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # keep serving the page; reconnect after a pause
            log.warning("dashboard consumer failed; retrying", error=str(exc))
            await asyncio.sleep(2.0)


def create_app(
    settings: DashboardSettings, kafka: KafkaSettings, topics: tuple[Topic[Any], ...] = DEFAULT_TOPICS
) -> FastAPI:
    state = DashboardState(max_sessions=settings.max_sessions)
    page = resources.files("dashboard").joinpath("static/index.html").read_text()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        group = f"{settings.group_prefix}-{secrets.token_hex(4)}"
        task = asyncio.create_task(_follow(kafka, topics, group, state, settings.kafka_client))
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    app = FastAPI(title="floe dashboard", lifespan=lifespan)
    app.state.dashboard = state

    @app.get("/", response_class=HTMLResponse)
    async def index() -> str:
        return page

    @app.get("/api/state")
    async def api_state() -> dict[str, Any]:
        return state.snapshot()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    return app
