"""The steps every provider route shares: find the call's session, run its ``Turn``, answer in JSON or SSE."""

from __future__ import annotations

import typing
from collections.abc import AsyncIterator, Callable
from typing import Any

import structlog
from fastapi import Request
from fastapi.responses import Response

from contracts import Protocol
from gateway.auth import presented_token
from gateway.canonical import CanonicalRequest, TurnResult
from gateway.core import Gateway, Turn
from gateway.errors import NotFound, Unauthenticated
from gateway.protocols.sse import SSE_HEADERS
from gateway.registry import Session, SessionRegistry
from gateway.responses import EventStream, json_response

__all__ = ["ProtocolModule", "gateway_of", "prompt_tokens", "run", "session_of"]

log = structlog.get_logger()


class ProtocolModule(typing.Protocol):
    """What ``run`` uses of a protocol module (``gateway.protocols.<value>``)."""

    PROTOCOL: Protocol

    def render_json(self, r: TurnResult) -> dict[str, Any]: ...


def gateway_of(request: Request) -> Gateway:
    gw: Gateway = request.app.state.gateway
    return gw


def session_of(request: Request, model: str | None) -> Session:
    """The session of the presented token (a 401 and a metric if none), checked against the requested model."""
    registry: SessionRegistry = request.app.state.registry
    try:
        session = registry.resolve(presented_token(request))
    except Unauthenticated as exc:
        gateway_of(request).metrics.rejected.labels(reason=exc.reason).inc()
        log.warning("credentials_rejected", reason=exc.reason, path=request.url.path)
        raise
    settings = gateway_of(request).settings
    if settings.strict_models and model is not None and model not in {session.model, *settings.model_aliases}:
        raise NotFound(f"model {model!r} does not exist")
    structlog.contextvars.bind_contextvars(session_id=session.session_id)
    return session


async def run(
    request: Request,
    session: Session,
    canon: CanonicalRequest,
    api: ProtocolModule,
    stream: Callable[[Turn], AsyncIterator[bytes]] | None,
) -> Response:
    turn = Turn(gateway_of(request), session, canon, api.PROTOCOL)
    await turn.start()
    if canon.stream and stream is not None:
        return EventStream(stream(turn), headers=SSE_HEADERS, settled=lambda: turn.recorded)
    async for _ in turn.events():
        pass
    return json_response(api.render_json(turn.result))


async def prompt_tokens(request: Request, session: Session, canon: CanonicalRequest) -> int:
    """Prompt tokens of a request as the engine's chat template renders it (count-tokens endpoints; no call made)."""
    kw = {"enable_thinking": canon.thinking} if canon.thinking is not None else None
    tok = await gateway_of(request).engine.tokenize_chat(
        session.session_id,
        [m.to_engine() for m in canon.messages],
        [t.to_engine() for t in canon.tools],
        add_generation_prompt=True,
        chat_template_kwargs=kw,
    )
    return len(tok.tokens)
