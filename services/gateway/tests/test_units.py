"""Pure units: the output parser, the consistent-hash ring, replica failover, the public surface."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st

import gateway
from eventbus import KafkaSettings
from eventbus.producer import producer_config
from gateway import GatewaySettings, create_app, upstream
from gateway.app import record_producer_config
from gateway.canonical import ReasoningDelta, TextDelta, ToolCallDelta
from gateway.output_parser import OutputParser
from gateway.upstream import EngineClient, HashRing

from ._fakes import MemorySink, free_port, serve
from .conftest import CONTROL


def _parse(chunks: list[str]) -> list:
    p = OutputParser()
    out = []
    for c in chunks:
        out += p.feed(c)
    return out + p.finish()


def _merge(evs: list) -> list:
    merged: list = []
    for e in evs:
        if merged and type(e) is type(merged[-1]) and isinstance(e, (TextDelta, ReasoningDelta)):
            merged[-1] = type(e)(merged[-1].text + e.text)
        else:
            merged.append(e)
    return merged


TEXT = 'a<think>r</think>b<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>c<tool_call>{bad</tool_call>'


@given(st.lists(st.integers(min_value=1, max_value=len(TEXT) - 1), max_size=12))
def test_parser_is_independent_of_chunking(cuts: list[int]) -> None:
    cuts = sorted(set(cuts))
    chunks = [TEXT[i:j] for i, j in zip([0, *cuts], [*cuts, len(TEXT)], strict=True)]
    evs = _merge(_parse(chunks))
    kinds = [type(e).__name__ for e in evs]
    assert kinds == ["TextDelta", "ReasoningDelta", "TextDelta", "ToolCallDelta", "TextDelta"]
    assert evs[1].text == "r"
    assert (
        isinstance(evs[3], ToolCallDelta) and evs[3].call.name == "f" and json.loads(evs[3].call.arguments) == {"x": 1}
    )
    assert evs[4].text == "c<tool_call>{bad</tool_call>"  # malformed call kept as text, never dropped


def test_unterminated_tool_call_is_text() -> None:
    evs = _merge(_parse(['hi <tool_call>{"name": "f"']))
    assert [e.text for e in evs] == ['hi <tool_call>{"name": "f"']


def test_ring_is_stable_and_balanced() -> None:
    nodes = [f"http://e{i}:8000" for i in range(4)]
    ring = HashRing(nodes)
    owners = [ring.order(f"session-{i}")[0] for i in range(2000)]
    assert owners == [HashRing(nodes).order(f"session-{i}")[0] for i in range(2000)]
    counts = {n: owners.count(n) for n in nodes}
    assert min(counts.values()) > 300, counts
    assert all(sorted(ring.order(f"s{i}")) == sorted(nodes) for i in range(50))
    # removing a node only moves the sessions it owned
    smaller = HashRing(nodes[:3])
    moved = sum(1 for i, o in enumerate(owners) if o != nodes[3] and smaller.order(f"session-{i}")[0] != o)
    assert moved == 0


def test_ring_order_is_kept_per_session_and_recomputed_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    nodes = [f"http://e{i}:8000" for i in range(3)]
    ring = HashRing(nodes)
    first = {f"s{i}": ring.order(f"s{i}") for i in range(40)}
    assert all(ring.order(k) is v for k, v in first.items())  # asked again: the kept order itself
    monkeypatch.setattr(upstream, "_MEMO_KEYS", 8)  # a full memory is cleared, and the orders come out the same
    small = HashRing(nodes)
    assert {f"s{i}": small.order(f"s{i}") for i in range(40)} == first
    assert 0 < len(small._orders) <= 8


async def test_a_replica_is_skipped_while_marked_down_then_taken_again() -> None:
    nodes = [f"http://e{i}:8000" for i in range(3)]
    client = EngineClient(nodes, model="m", timeout_s=1, connect_timeout_s=1, unhealthy_s=0.2)
    try:
        order = client.replicas("s")
        assert sorted(order) == sorted(nodes)
        client._mark_down(order[0])
        assert client.replicas("s") == order[1:]
        for url in order:  # all down: the order as it is (the caller then tries each and reports a 503)
            client._mark_down(url)
        assert client.replicas("s") == order
        await asyncio.sleep(0.3)
        assert client.replicas("s") == order and not client._down_until  # the skips ran out and were dropped
    finally:
        await client.aclose()


def test_failover_to_the_next_replica(fake_engine) -> None:
    _, engine_url = fake_engine
    dead = f"http://127.0.0.1:{free_port()}"
    port = free_port()
    s = GatewaySettings(engine_urls=[dead, engine_url], control_token=CONTROL, public_url=f"http://127.0.0.1:{port}")
    sink = MemorySink()
    with serve(create_app(s, sink=sink), port) as url:
        for i in range(6):  # some of these sessions hash to the dead replica first
            tok = httpx.post(
                url + "/admin/sessions", json={"session_id": f"f{i}"}, headers={"authorization": f"Bearer {CONTROL}"}
            ).json()["token"]
            client = openai.OpenAI(base_url=url + "/v1", api_key=tok, max_retries=0)
            out = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
            assert out.choices[0].message.content == "Hello! You said: hi"
        assert {r.engine_id for r in sink.events} == {engine_url}


def test_all_replicas_down_is_a_503(fake_engine) -> None:
    port = free_port()
    s = GatewaySettings(
        engine_urls=[f"http://127.0.0.1:{free_port()}"],
        control_token=CONTROL,
        public_url=f"http://127.0.0.1:{port}",
        engine_model="x",
    )
    with serve(create_app(s, sink=MemorySink()), port) as url:
        tok = httpx.post(
            url + "/admin/sessions", json={"session_id": "d"}, headers={"authorization": f"Bearer {CONTROL}"}
        ).json()["token"]
        r = httpx.post(
            url + "/v1/messages",
            headers={"x-api-key": tok},
            json={"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
        )
        assert r.status_code == 503 and r.json()["error"]["type"] == "overloaded_error" and "retry-after" in r.headers


def test_exported_members() -> None:
    assert sorted(gateway.__all__) == ["GatewaySettings", "SessionCredentials", "SessionRegistry", "create_app"]
    for name in gateway.__all__:
        assert getattr(gateway, name) is not None


def test_record_producer_does_not_linger(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every call ends once its record is acked: the gateway's producer sends at once unless told to wait."""
    assert producer_config(KafkaSettings())["linger.ms"] > 0  # the eventbus default the gateway overrides
    assert producer_config(KafkaSettings(), **record_producer_config(GatewaySettings()))["linger.ms"] == 0
    monkeypatch.setenv("FLOE_GATEWAY_RECORD_LINGER_MS", "5")
    assert producer_config(KafkaSettings(), **record_producer_config(GatewaySettings()))["linger.ms"] == 5
    monkeypatch.setenv("FLOE_GATEWAY_RECORD_LINGER_MS", "-1")
    with pytest.raises(ValueError, match="record_linger_ms"):
        GatewaySettings()
