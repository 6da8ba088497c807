"""Operator routes: sessions (``/admin/sessions``), pause/resume for weight syncs, health, metrics, ``HEAD /``.

The ``/admin`` routes need the control token (``Authorization: Bearer``); their errors are OpenAI-shaped, like every
path no provider claims.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, Field

from contracts import SamplingPolicy, TokenizationMode
from eventbus import critical_failure
from gateway.errors import Forbidden, NotFound
from gateway.metrics import GatewayMetrics
from gateway.registry import SessionRegistry
from gateway.routes.calls import gateway_of
from gateway.settings import GatewaySettings

__all__ = ["CreateSession", "PauseRequest", "router"]

router = APIRouter()


class CreateSession(BaseModel):
    session_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
    group_id: str = Field(default="", max_length=128)
    tokenization: TokenizationMode | None = None
    sampling: SamplingPolicy | None = None
    model: str = "floe-policy"
    ttl_s: float | None = Field(default=None, gt=0)


class PauseRequest(BaseModel):
    timeout_s: float | None = Field(default=None, ge=0)


def _admin(request: Request) -> tuple[SessionRegistry, GatewaySettings]:
    settings: GatewaySettings = request.app.state.settings
    expected = settings.control_token
    auth = request.headers.get("authorization", "")
    if expected is None or auth != f"Bearer {expected.get_secret_value()}":
        raise Forbidden("admin routes need the control token")
    return request.app.state.registry, settings


@router.post("/admin/sessions")
async def create_session(request: Request, body: CreateSession) -> dict[str, Any]:
    registry, settings = _admin(request)
    creds = registry.create(
        body.session_id,
        body.group_id or body.session_id,
        body.tokenization or settings.default_tokenization,
        body.sampling or settings.default_sampling,
        body.model,
        body.ttl_s,
    )
    return dict(creds.as_json())


@router.get("/admin/sessions/{session_id}")
async def session_stats(request: Request, session_id: str) -> dict[str, Any]:
    registry, _ = _admin(request)
    stats = registry.stats(session_id)
    if not stats:
        raise NotFound(f"no session {session_id!r}")
    return {"session_id": session_id, **stats}


@router.delete("/admin/sessions/{session_id}")
async def close_session(request: Request, session_id: str) -> dict[str, Any]:
    registry, _ = _admin(request)
    if not registry.close(session_id):
        raise NotFound(f"no session {session_id!r}")
    return {"session_id": session_id, "closed": True}


@router.post("/admin/pause")
async def pause(request: Request, body: PauseRequest | None = None) -> dict[str, Any]:
    _, settings = _admin(request)
    gw = gateway_of(request)
    timeout = body.timeout_s if body and body.timeout_s is not None else settings.pause_timeout_s
    t0 = time.perf_counter()
    drained = await gw.admission.pause(timeout)
    return {
        "paused": True,
        "drained": drained,
        "inflight": gw.admission.inflight,
        "drain_seconds": round(time.perf_counter() - t0, 4),
    }


@router.post("/admin/resume")
async def resume(request: Request) -> dict[str, Any]:
    _admin(request)
    gateway_of(request).admission.resume()
    return {"paused": False}


@router.get("/health")  # the name every other floe service uses
@router.get("/healthz")
async def healthz(request: Request) -> JSONResponse:
    gw = gateway_of(request)
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


@router.get("/metrics")
async def metrics_route(request: Request) -> Response:
    metrics: GatewayMetrics = request.app.state.metrics
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)


@router.head("/")
async def head_root() -> Response:
    return Response(status_code=200)
