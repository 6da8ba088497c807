"""Crash-only serving: a dead critical task fails /health and stops the server with exit code 1; a cancelled one
(a normal shutdown) is no failure."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from eventbus import before_shutdown, critical_failure, critical_task, serve


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _app() -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async def pipeline() -> None:
            await asyncio.sleep(0.5)  # long enough for the test to see it healthy first
            raise RuntimeError("pipeline broke")

        task = critical_task(app, pipeline(), "pipeline")
        yield
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    app = FastAPI(lifespan=lifespan)

    @app.get("/health")
    async def health() -> JSONResponse:
        failure = critical_failure(app)
        return JSONResponse({"error": failure}, status_code=503 if failure else 200)

    return app


def test_a_dead_critical_task_stops_the_server_with_exit_code_1() -> None:
    app, port = _app(), _free_port()
    seen: list[int] = []

    def poll() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
                    seen.append(resp.status)
            except urllib.error.HTTPError as exc:
                seen.append(exc.code)
            except OSError:
                if seen:
                    return  # the server went away
            time.sleep(0.05)

    poller = threading.Thread(target=poll)
    poller.start()
    code = serve(app, "127.0.0.1", port)
    poller.join()
    assert code == 1
    assert critical_failure(app) == "pipeline: RuntimeError('pipeline broke')"
    assert seen and seen[0] == 200, "healthy before the task died"


async def test_a_cancelled_critical_task_is_not_a_failure() -> None:
    app = FastAPI()
    task = critical_task(app, asyncio.sleep(60), "sleeper")
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert critical_failure(app) is None


def test_before_shutdown_hooks_run_while_the_server_still_answers() -> None:
    # The gateway node's order: its session runner stops first, while its sessions' calls can still reach the
    # proxy; uvicorn's own shutdown closes the port before the lifespan ends.
    port = _free_port()
    app = FastAPI()
    answered: list[int] = []
    order: list[str] = []

    @app.get("/health")
    async def health() -> JSONResponse:
        return JSONResponse({})

    def fetch() -> int:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as resp:
            return int(resp.status)

    async def first() -> None:
        order.append("first")
        answered.append(await asyncio.to_thread(fetch))

    async def broken() -> None:
        order.append("broken")
        raise RuntimeError("a failing hook does not stop the shutdown")

    async def last() -> None:
        order.append("last")

    for hook in (first, broken, last):
        before_shutdown(app, hook)

    def stop_when_up() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                fetch()
                break
            time.sleep(0.05)
        app.state.floe_stop_server()

    stopper = threading.Thread(target=stop_when_up)
    stopper.start()
    assert serve(app, "127.0.0.1", port) == 0
    stopper.join()
    assert order == ["first", "broken", "last"] and answered == [200]
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        raise AssertionError("the port still accepts after the shutdown")


_FREEZE_APP = """
import gc, sys
from fastapi import FastAPI
from eventbus import serve
app = FastAPI()
@app.get("/frozen")
async def frozen() -> dict:
    return {"frozen": gc.get_freeze_count()}
serve(app, "127.0.0.1", int(sys.argv[1]), freeze_heap=sys.argv[2] == "yes")
"""


def test_freeze_heap_freezes_what_startup_built_and_only_when_asked() -> None:
    for ask, expect_frozen in (("yes", True), ("no", False)):
        port = _free_port()
        proc = subprocess.Popen([sys.executable, "-c", _FREEZE_APP, str(port), ask])
        try:
            deadline, frozen = time.monotonic() + 30, None
            while frozen is None and time.monotonic() < deadline:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/frozen", timeout=2) as resp:
                        frozen = json.loads(resp.read())["frozen"]
                except (urllib.error.URLError, ConnectionError):
                    time.sleep(0.1)
            assert frozen is not None, "the server never answered"
            # Everything imported and built before serving (fastapi, pydantic, the app) is tens of thousands of objects.
            assert (frozen > 10_000) is expect_frozen, (ask, frozen)
        finally:
            proc.terminate()
            proc.wait(30)
