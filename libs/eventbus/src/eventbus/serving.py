"""Crash-only serving for floe's HTTP services.

A service that serves HTTP in front of a background task it cannot work without (the rollout pipeline, a gateway
node's session runner, the engine's weight reloader) must not keep answering healthily after that task died: a
supervisor would never restart it, and the failure would only show as work that silently stopped.

- ``critical_task(app, coro, name)`` starts such a task. If it dies of an exception, the exception is logged,
  ``critical_failure(app)`` reports it (health endpoints answer 503 with it), and a server started by ``serve``
  shuts down.
- ``serve(app, host, port)`` runs uvicorn and returns the process exit code: 1 after a critical failure, else 0.
  State lives in Kafka (committed offsets, transactions), so a restarted process picks up where the dead one
  committed.
- ``before_shutdown(app, hook)``: an async hook ``serve`` runs at SIGTERM *before* uvicorn stops accepting
  connections, each bounded by ``DRAIN_S``. uvicorn's own order is: stop listening, wait for open requests, then the
  lifespan's shutdown; a gateway node's session runner stopped only there went on starting sessions whose agents
  found the port closed. Its hook stops the runner first, while its sessions' calls can still be answered.
  Requests still open after that get ``GRACEFUL_S`` before uvicorn cancels them.
- ``serve(..., freeze_heap=True)`` freezes the heap (``gc.freeze``) once the app's startup is done: what startup
  built (modules, routes, pydantic schemas, clients) lives as long as the process, and a full collection no longer
  walks it (the gateway: ``docs/scaling.md``). Only for a service whose startup objects all live that long: a frozen
  object in a reference cycle is never freed, e.g. the engine's first model after a weight swap.

In-process servers (``serve_in_thread``: uvicorn in a thread, for tests and benches) get the logging and the 503s but
are never stopped by a critical failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any

import structlog
import uvicorn
from fastapi import FastAPI

from eventbus.errors import BrokerUnavailable
from eventbus.settings import KafkaSettings

__all__ = ["before_shutdown", "critical_failure", "critical_task", "serve", "serve_in_thread"]

log = structlog.get_logger()

_FAILURE = "floe_critical_failure"
_STOP = "floe_stop_server"
_BEFORE = "floe_before_shutdown"
DRAIN_S = 15.0  # one hook's bound; below a supervisor's usual grace (compose: 10 s default, ours: 20 s)
GRACEFUL_S = 5  # open requests after the hooks, before uvicorn cancels them


def before_shutdown(app: FastAPI, hook: Callable[[], Coroutine[Any, Any, Any]]) -> None:
    """Run ``hook()`` first when ``serve`` shuts ``app`` down (see the module docstring); hooks run in order."""
    hooks: list[Callable[[], Coroutine[Any, Any, Any]]] = getattr(app.state, _BEFORE, None) or []
    hooks.append(hook)
    setattr(app.state, _BEFORE, hooks)


class _Server(uvicorn.Server):
    """uvicorn's server with ``before_shutdown`` hooks run ahead of its own shutdown."""

    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        super().__init__(config)
        self._app = app

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for hook in getattr(self._app.state, _BEFORE, None) or []:
            try:
                await asyncio.wait_for(hook(), DRAIN_S)
            except Exception as exc:  # a hook that fails or hangs must not keep the process up
                log.warning("shutdown hook failed", hook=getattr(hook, "__qualname__", repr(hook)), error=repr(exc))
        await super().shutdown(sockets)


def critical_task(app: FastAPI, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
    """Start ``coro`` as a task whose death by exception fails the service (cancellation is a normal stop)."""
    task = asyncio.create_task(coro, name=name)

    def done(t: asyncio.Task[Any]) -> None:
        if t.cancelled() or t.exception() is None:
            return
        error = t.exception()
        setattr(app.state, _FAILURE, f"{name}: {error!r}")
        log.error("critical task died; the service stops", task=name, error=repr(error))
        stop: Callable[[], None] | None = getattr(app.state, _STOP, None)
        if stop is not None:
            stop()

    task.add_done_callback(done)
    return task


def critical_failure(app: FastAPI) -> str | None:
    """``"<task>: <exception>"`` once a critical task of ``app`` died, else None."""
    failure: str | None = getattr(app.state, _FAILURE, None)
    return failure


def serve(app: FastAPI, host: str, port: int, *, log_level: str = "warning", freeze_heap: bool = False) -> int:
    """Run ``app`` until SIGINT/SIGTERM or a critical task's death; the exit code says which (0 or 1), or 2 when the
    service could not start because the broker is unreachable (one error line that says where it looked and how to
    start one, not uvicorn's traceback of the lifespan)."""
    # loop="auto" (uvicorn's default) serves on uvloop, a dependency of this package, where it installs (not Windows):
    # a gateway call then costs ~10 % less CPU than on asyncio's loop (bench/gateway, docs/scaling.md).
    # access_log only where the level prints it: uvicorn otherwise still formats each response's client address and
    # path for a logger call that drops them (a few microseconds of every gateway call). The client address behind a
    # proxy (X-Forwarded-For) is read only for that log: nothing else asks for it, so without the log uvicorn's proxy
    # headers middleware, one more frame and a scan of the headers on every request, is left out as well.
    access_log = log_level.lower() in ("trace", "debug", "info")
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        access_log=access_log,
        proxy_headers=access_log,
        timeout_graceful_shutdown=GRACEFUL_S,
    )
    server = _Server(config, app)
    unreachable: list[str] = []
    inner = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(a: Any) -> AsyncIterator[Any]:
        async with contextlib.AsyncExitStack() as stack:
            try:
                state = await stack.enter_async_context(inner(a))
            except BrokerUnavailable as exc:
                unreachable.append(str(exc))
                log.error(
                    "cannot start: the Kafka broker is unreachable",
                    bootstrap_servers=KafkaSettings().bootstrap_servers,
                    error=str(exc),
                    hint="start one (floe kafka up) or point FLOE_KAFKA_BOOTSTRAP_SERVERS (or --broker) at yours",
                )
                server.should_exit = True  # uvicorn returns before binding the port
                yield None
                return
            if freeze_heap:
                gc.collect()
                gc.freeze()
            yield state

    app.router.lifespan_context = lifespan

    def stop() -> None:
        server.should_exit = True

    setattr(app.state, _STOP, stop)
    server.run()
    if unreachable:
        return 2
    return 1 if critical_failure(app) is not None else 0


@contextlib.contextmanager
def serve_in_thread(app: Any, port: int | None = None, *, start_timeout_s: float = 60.0) -> Iterator[str]:
    """Serve the ASGI ``app`` with uvicorn in a daemon thread on a loopback ``port`` (a free one by default) and
    yield its base URL; stop it on exit. For tests and benches that need a real server in their own process.

    The socket is bound here and handed to uvicorn: a port picked free and bound later could be taken in between."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port or 0))
    port = int(sock.getsockname()[1])
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    try:
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server on port {port} did not start")
            time.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
