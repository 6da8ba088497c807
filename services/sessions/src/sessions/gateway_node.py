"""A gateway node: the model-API proxy (``gateway``) and the session runner (``sessions``) in one process.

This is the one module that imports both. They share a process because the session registry is in-process: the
runner mints each session's token in the proxy's own ``SessionRegistry`` and points the harness at the proxy's own
listening address (not the public URL, which may be a load balancer). That is Polar's shape and the cheapest one.

- ``RegistryGateway``: the runner's view of the proxy (``runner.SessionGateway``) over ``app.state.registry``.
- ``node_extension``: a ``gateway.create_app`` lifespan extension that runs a ``SessionNode`` on Kafka; if the runner
  dies, the process's ``/health`` turns 503 and it exits 1 (crash-only, like every floe service). At SIGTERM the
  runner stops first, then the proxy (``eventbus.before_shutdown``).
- ``create_node_app`` / ``serve``: ``python -m sessions`` (``floe serve sessions``) runs a node.
- ``local_gateway``: an in-process proxy on a free loopback port, for ``floe session run``.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import urlsplit

import structlog
from fastapi import FastAPI

from contracts import SessionRequested
from eventbus import KafkaSettings, before_shutdown, critical_task
from gateway import GatewaySettings, create_app
from gateway.registry import SessionRegistry
from sessions.metrics import SessionMetrics
from sessions.node import SessionNode
from sessions.runner import SessionStats
from sessions.settings import SessionSettings

__all__ = ["RegistryGateway", "create_node_app", "local_gateway", "node_extension", "serve"]

log = structlog.get_logger()


class RegistryGateway:
    def __init__(self, registry: SessionRegistry, url: str, *, ttl_margin_s: float = 60.0) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname or not parts.port:
            raise ValueError(f"gateway url must be http://host:port, got {url!r}")
        self.registry = registry
        self._address = (parts.hostname, parts.port)
        self._ttl_margin_s = ttl_margin_s

    @property
    def address(self) -> tuple[str, int]:
        return self._address

    def open(self, request: SessionRequested) -> str:
        creds = self.registry.create(
            request.session_id,
            request.group_id,
            request.tokenization,
            request.sampling,
            request.model,
            ttl_s=request.session_timeout_s + self._ttl_margin_s,
        )
        return creds.token

    def stats(self, session_id: str) -> SessionStats:
        stats = self.registry.stats(session_id)
        ok, failed = stats.get("calls_ok", 0), stats.get("calls_failed", 0)
        # ``calls`` is what consumers can expect on the model-calls topic (the rollout waits for that many records
        # and counts a session usable by it): a call the gateway could not serve has no record, so it is counted
        # apart (``failed``, published as timings_ms["failed_calls"]).
        return SessionStats(
            calls=ok,
            turns=ok,
            failed=failed,
            last_error=stats.get("last_error"),
            unrecorded=dict(stats.get("unrecorded", {})),
        )

    def close(self, session_id: str) -> None:
        self.registry.close(session_id)


def node_extension(
    gateway_settings: GatewaySettings, kafka: KafkaSettings, session_settings: SessionSettings | None = None
) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    """The session runner as a lifespan extension of the proxy app (``create_app(..., extensions=[...])``)."""

    @contextlib.asynccontextmanager
    async def run_node(app: FastAPI) -> AsyncIterator[None]:
        node = SessionNode(
            session_settings or SessionSettings(),
            kafka,
            RegistryGateway(app.state.registry, f"http://127.0.0.1:{gateway_settings.port}"),
            metrics=SessionMetrics(app.state.metrics.registry),
        )
        # A node whose runner died would keep proxying while its sessions strand: fail the process instead.
        task = critical_task(app, node.run(), "session node")

        async def stop_node() -> None:
            # Before the proxy stops listening (``before_shutdown``): no new session starts, and the running ones
            # end FAILED "node shutting down" while their calls can still be answered.
            log.info("session node stopping", node_id=node.settings.node_id, running=len(node.active))
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

        before_shutdown(app, stop_node)
        log.info("session_node_started", node_id=node.settings.node_id)
        try:
            yield
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)  # a death was already logged by critical_task

    return run_node


def create_node_app(
    gateway_settings: GatewaySettings | None = None,
    *,
    kafka: KafkaSettings | None = None,
    session_settings: SessionSettings | None = None,
) -> FastAPI:
    gateway_settings = gateway_settings or GatewaySettings()
    kafka = kafka or KafkaSettings()
    return create_app(
        gateway_settings, kafka=kafka, extensions=[node_extension(gateway_settings, kafka, session_settings)]
    )


def serve(argv: list[str] | None = None) -> int:
    """Run a gateway node until SIGTERM; exits 1 when the session runner (or anything critical) died."""
    from eventbus import configure_logging
    from eventbus import serve as serve_app
    from eventbus.entrypoint import Flag, parse_service_args
    from gateway.cli import gateway_flags

    parse_service_args(
        "python -m sessions",
        "Run a gateway node: the model-API proxy and the session runner in one process. Settings: FLOE_GATEWAY_* "
        "(the proxy), FLOE_GATEWAY_SESSIONS_* (the runner), FLOE_KAFKA_*; the flags override them.",
        [
            *gateway_flags(),
            Flag("--node-id", "FLOE_GATEWAY_SESSIONS_NODE_ID", "this node's name in session events", metavar="ID"),
            Flag(
                "--max-running", "FLOE_GATEWAY_SESSIONS_MAX_RUNNING", "sessions running at once", type=int, metavar="N"
            ),
            Flag("--work-root", "FLOE_GATEWAY_SESSIONS_WORK_ROOT", "session and pool directories", metavar="DIR"),
        ],
        argv,
    )

    settings = GatewaySettings()
    configure_logging("gateway", settings.log_level)
    return serve_app(create_node_app(settings), settings.host, settings.port, freeze_heap=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def local_gateway(engine_url: str, sink: Any) -> AsyncIterator[RegistryGateway]:
    """A proxy on a free loopback port whose records go to ``sink`` (``async send(topic, event)``), not Kafka."""
    import uvicorn

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    app = create_app(GatewaySettings(engine_urls=[engine_url], public_url=url, port=port), sink=sink)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    serving = asyncio.create_task(server.serve())
    while not server.started:
        if serving.done():
            raise RuntimeError("the in-process gateway failed to start")
        await asyncio.sleep(0.02)
    try:
        yield RegistryGateway(app.state.registry, url)
    finally:
        server.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(serving, 10)
