"""Fixtures of the gateway tests: a fake engine and a gateway, each a real uvicorn server on a loopback port."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import uvloop

from contracts import SamplingPolicy, TokenizationMode
from gateway import GatewaySettings, create_app

from ._fakes import FakeEngine, MemorySink, free_port, serve

CONTROL = "control-secret"
# The engine hop's own tests run on both event loops: the gateway serves on uvloop (uvicorn picks it), while a caller
# embedding the client may run asyncio's; transports, pausing and closing differ between the two.
BOTH_LOOPS = ("test_engine_http.py",)


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> Mapping[str, Callable[[], Any]]:
    if item.path.name in BOTH_LOOPS:
        return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
    return {"asyncio": asyncio.new_event_loop}


@dataclass
class GatewayHarness:
    url: str
    app: Any
    engine: FakeEngine
    sink: MemorySink

    def session(
        self,
        session_id: str = "s1",
        mode: TokenizationMode = TokenizationMode.CANONICAL,
        sampling: SamplingPolicy | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"session_id": session_id, "group_id": "g1", "tokenization": mode.value}
        if sampling is not None:
            body["sampling"] = sampling.model_dump()
        r = httpx.post(f"{self.url}/admin/sessions", json=body, headers={"authorization": f"Bearer {CONTROL}"})
        r.raise_for_status()
        return dict(r.json())


@pytest.fixture(scope="module")
def fake_engine() -> Iterator[tuple[FakeEngine, str]]:
    engine = FakeEngine()
    with serve(engine.app) as url:
        yield engine, url


@pytest.fixture
def gw(fake_engine: tuple[FakeEngine, str]) -> Iterator[GatewayHarness]:
    engine, engine_url = fake_engine
    sink = MemorySink()
    port = free_port()
    settings = GatewaySettings(
        engine_urls=[engine_url], control_token=CONTROL, retry_after_s=2, public_url=f"http://127.0.0.1:{port}"
    )
    app = create_app(settings, sink=sink)
    with serve(app, port) as url:
        yield GatewayHarness(url, app, engine, sink)
