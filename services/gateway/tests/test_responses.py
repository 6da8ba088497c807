"""``gateway.responses.EventStream`` at its ASGI boundary: what it sends, and how it ends when the client leaves.

The whole path (uvicorn, a real socket, a client that closes mid-stream) is covered by
``test_sessions_admin.py::test_client_leaving_mid_stream_is_not_recorded``; here the ASGI messages
are checked one by one, which a socket cannot show (how the bytes were grouped into writes).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

from gateway.protocols.sse import Lead
from gateway.responses import EventStream


async def _chunks(items: list[bytes]) -> AsyncIterator[bytes]:
    for item in items:
        await asyncio.sleep(0)
        yield item


async def test_leads_go_out_in_one_write_with_the_next_event_and_nothing_is_reordered() -> None:
    sent: list[MutableMapping[str, Any]] = []

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()  # the client stays
        raise AssertionError

    items = [Lead(b"a"), Lead(b"b"), b"c", b"d", Lead(b"e"), b"f", Lead(b"g")]
    await EventStream(_chunks(items), headers={"x-test": "1"})({"type": "http"}, receive, send)
    assert sent[0]["type"] == "http.response.start"
    assert (b"x-test", b"1") in sent[0]["headers"]
    assert [(m["body"], m["more_body"]) for m in sent[1:]] == [
        (b"abc", True),
        (b"d", True),
        (b"ef", True),
        (b"g", False),  # a lead at the end still goes out, with the end of the body
    ]


async def test_once_settled_the_tail_goes_out_in_one_write_with_the_end_of_the_body() -> None:
    sent: list[MutableMapping[str, Any]] = []
    state = {"recorded": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()
        raise AssertionError

    async def turn() -> AsyncIterator[bytes]:
        yield Lead(b"a")
        yield b"b"
        await asyncio.sleep(0)
        yield b"c"
        state["recorded"] = True  # the record is durable: what follows is the stream's tail
        yield b"d"
        yield Lead(b"e")
        yield b"f"

    await EventStream(turn(), settled=lambda: state["recorded"])({"type": "http"}, receive, send)
    assert [(m["body"], m["more_body"]) for m in sent[1:]] == [(b"ab", True), (b"c", True), (b"def", False)]


async def test_a_client_that_leaves_ends_the_stream_where_it_waits_and_closes_the_iterator() -> None:
    gone = asyncio.Event()
    closed: list[str] = []

    async def waits_for_the_engine() -> AsyncIterator[bytes]:
        try:
            yield b"first"
            await asyncio.sleep(30)  # the engine's next token, which never comes in time
            yield b"never"
        except (GeneratorExit, asyncio.CancelledError) as exc:
            closed.append(type(exc).__name__)
            raise

    sent: list[MutableMapping[str, Any]] = []

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)
        if message.get("body") == b"first":
            gone.set()

    async def receive() -> dict[str, Any]:
        await gone.wait()
        return {"type": "http.disconnect"}

    async with asyncio.timeout(5):
        # returns normally: the cancellation was the stream's own, for a client that left
        await EventStream(waits_for_the_engine())({"type": "http"}, receive, send)
    assert [m.get("body") for m in sent[1:]] == [b"first"]
    assert closed == ["CancelledError"]
    assert not asyncio.current_task().cancelling()  # type: ignore[union-attr]
