"""``/health`` and ``/metrics`` for any floe service: ``app.include_router(health_router(checks={...}))``.

``/health`` runs every check (sync or async callables returning bool; an exception counts as failing) and answers
200 ``{"status": "ok", "checks": {...}}`` or 503 ``{"status": "failing", ...}``. ``/metrics`` renders a
prometheus_client registry (the default one unless given) in the text exposition format.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import structlog
from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

__all__ = ["HealthCheck", "health_router"]

log = structlog.get_logger()

HealthCheck = Callable[[], bool | Awaitable[bool]]


def health_router(
    checks: Mapping[str, HealthCheck] | None = None,
    registry: CollectorRegistry | None = None,
    service: str | None = None,
) -> APIRouter:
    router = APIRouter()
    checks = dict(checks or {})
    reg = registry if registry is not None else REGISTRY

    @router.get("/health")
    async def health() -> JSONResponse:
        results: dict[str, Any] = {}
        ok = True
        for name, check in checks.items():
            try:
                value = check()
                if inspect.isawaitable(value):
                    value = await value
                passed = bool(value)
                results[name] = "ok" if passed else "failing"
            except Exception as exc:
                passed = False
                results[name] = f"error: {type(exc).__name__}: {exc}"
                log.warning("health check raised", check=name, error=repr(exc))
            ok = ok and passed
        body: dict[str, Any] = {"status": "ok" if ok else "failing", "checks": results}
        if service is not None:
            body["service"] = service
        return JSONResponse(body, status_code=200 if ok else 503)

    @router.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(reg), media_type=CONTENT_TYPE_LATEST)

    return router
