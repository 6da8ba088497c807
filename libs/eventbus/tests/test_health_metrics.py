"""health_router over a real uvicorn server on a free port, and the metric helpers."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
import uvicorn
from fastapi import FastAPI

from eventbus import health_router
from eventbus.metrics import bus_metrics, counter, gauge, histogram, new_registry


class Server:
    def __init__(self, app: FastAPI) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Server:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

    def get(self, path: str) -> tuple[int, str, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return r.status, r.headers["content-type"], r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.headers["content-type"], e.read().decode()


@pytest.fixture
def server() -> Iterator[tuple[Server, dict[str, bool]]]:
    state = {"kafka": True}
    registry = new_registry()
    served = counter("floe_test_requests_total", "requests", ["route"], registry)
    served.labels("x").inc(3)

    async def kafka_ok() -> bool:
        await asyncio.sleep(0)
        return state["kafka"]

    def broken() -> bool:
        if not state.get("broken_ok"):
            raise RuntimeError("disk gone")
        return True

    app = FastAPI()
    app.include_router(health_router({"kafka": kafka_ok, "disk": broken}, registry=registry, service="test"))
    state["broken_ok"] = True
    with Server(app) as srv:
        yield srv, state


def test_health_reports_each_check_and_fails_with_503(server: tuple[Server, dict[str, bool]]) -> None:
    srv, state = server
    status, _, body = srv.get("/health")
    assert status == 200 and '"status":"ok"' in body and '"service":"test"' in body
    state["kafka"] = False
    status, _, body = srv.get("/health")
    assert status == 503 and '"kafka":"failing"' in body
    state["kafka"], state["broken_ok"] = True, False
    status, _, body = srv.get("/health")
    assert status == 503 and "RuntimeError: disk gone" in body


def test_metrics_endpoint_exposes_the_registry(server: tuple[Server, dict[str, bool]]) -> None:
    srv, _ = server
    status, ctype, body = srv.get("/metrics")
    assert status == 200 and ctype.startswith("text/plain")
    assert 'floe_test_requests_total{route="x"} 3.0' in body


def test_metric_helpers_are_idempotent_per_registry() -> None:
    reg = new_registry()
    assert counter("floe_a_total", "a", registry=reg) is counter("floe_a_total", "a", registry=reg)
    assert gauge("floe_b", "b", registry=reg) is gauge("floe_b", "b", registry=reg)
    h = histogram("floe_c_seconds", "c", ["x"], registry=reg, buckets=(0.1, 1))
    h.labels("y").observe(0.5)
    with pytest.raises(ValueError, match="already exists"):
        gauge("floe_a_total", "a", registry=reg)
    other = new_registry()
    assert counter("floe_a_total", "a", registry=other) is not counter("floe_a_total", "a", registry=reg)
    m = bus_metrics(reg)
    m.produced.labels("t").inc()
    assert reg.get_sample_value("floe_eventbus_produced_total", {"topic": "t"}) == 1.0
