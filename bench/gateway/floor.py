"""The floor of ``bench/gateway``: the least a Python proxy on this stack can cost per call, as a column of the bench.

An ASGI app on uvicorn (the gateway's server) that forwards a chat completion to the engine with the gateway's own
engine hop (``gateway.engine_http``) and hands the engine's bytes back untouched: the whole answer for a client that
waits for it, each SSE event as it arrives for one that streams. No validation, no tokenization, no parsing of the
answer, no record. What the gateway costs above this column is its own work; what this column costs is uvicorn,
the event loop and the sockets on this machine, which no change inside the gateway can remove.

It speaks just enough of the gateway's surface for the bench: ``GET /healthz``, ``POST /admin/sessions`` (a dummy
token; credentials are ignored) and ``POST /v1/chat/completions``, to which it adds what the gateway asks the engine
for (``return_token_ids``, ``logprobs``; for a streamed call ``stream_interval``, the bench passes the gateway's
default).

With ``--raw``, the same forwarding without uvicorn or ASGI: an ``asyncio.Protocol`` that parses requests with
httptools (uvicorn's own parser) and writes each response itself, headers and body in one write. The difference
between the two columns is what uvicorn's request cycle costs, the part of the floor a server of floe's own for the
hot lane could remove. It is enough HTTP/1.1 for the bench's client (keep-alive, no pipelining, no limits or
timeouts), not a server for anything else.

    python bench/gateway/floor.py ENGINE_URL PORT [STREAM_INTERVAL] [--raw]
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import httptools
import uvicorn
import uvloop

from gateway.engine_http import EngineHTTP

Scope = dict[str, Any]
CHAT = "/v1/chat/completions"  # the one path forwarded to the engine
# What the bench needs of the gateway's other paths: health, and a (dummy) session token.
_CANNED = {"/healthz": b'{"ok":true}', "/admin/sessions": b'{"token":"floor"}'}


def _canned(path: str) -> tuple[int, bytes]:
    found = _CANNED.get(path)
    return (200, found) if found is not None else (404, b'{"error":"not found"}')


def app_for(engine_url: str, stream_interval: int = 1) -> Any:
    http: EngineHTTP | None = None

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        nonlocal http
        if scope["type"] != "http":
            return
        parts = []
        while True:
            message = await receive()
            parts.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        path = scope["path"]
        if path != CHAT:
            await _whole(send, *_canned(path))
            return
        if http is None:
            http = EngineHTTP(timeout_s=60, connect_timeout_s=5)
        body, stream = engine_body(b"".join(parts), stream_interval)
        r = await http.request("POST", engine_url + path, body)
        if not stream:
            await _whole(send, r.status, await r.read())
            return
        await send(
            {"type": "http.response.start", "status": r.status, "headers": [(b"content-type", b"text/event-stream")]}
        )
        async for line in r.lines():
            if line:  # one write per event, as the gateway makes
                await send({"type": "http.response.body", "body": line + b"\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app


def engine_body(raw: bytes, stream_interval: int) -> tuple[bytes, bool]:
    """The client's chat request with what the gateway asks the engine for, and whether it streams."""
    body = json.loads(raw)
    body.update(return_token_ids=True, logprobs=True, top_logprobs=0)
    stream = bool(body.get("stream"))
    if stream:
        body["stream_options"] = {"include_usage": True}
        if stream_interval > 1:
            body["stream_interval"] = stream_interval
    return json.dumps(body).encode(), stream


class RawFloor(asyncio.Protocol):
    """The floor without uvicorn: one connection, its requests parsed by httptools, each answered by a task."""

    def __init__(self, engine_url: str, stream_interval: int, http: EngineHTTP) -> None:
        self._engine_url, self._stream_interval, self._http = engine_url, stream_interval, http
        self._parser = httptools.HttpRequestParser(self)
        self._url, self._body = b"", bytearray()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's transports do not subclass asyncio's

    def data_received(self, data: bytes) -> None:
        self._parser.feed_data(data)

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_body(self, body: bytes) -> None:
        self._body += body

    def on_message_complete(self) -> None:
        path, body = self._url.partition(b"?")[0], bytes(self._body)
        self._url, self._body = b"", bytearray()
        asyncio.get_running_loop().create_task(self._answer(path, body))

    def _write(self, data: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    def _whole(self, status: int, content: bytes) -> None:
        head = b"HTTP/1.1 %d \r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % (status, len(content))
        self._write(head + content)

    async def _answer(self, path: bytes, raw: bytes) -> None:
        if path != CHAT.encode():
            return self._whole(*_canned(path.decode()))
        body, stream = engine_body(raw, self._stream_interval)
        r = await self._http.request("POST", self._engine_url + path.decode(), body)
        if not stream:
            return self._whole(r.status, await r.read())
        head = b"HTTP/1.1 %d \r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n" % r.status
        async for line in r.lines():
            if line:  # one write per event, as the gateway makes (the first with the headers)
                event = line + b"\n\n"
                self._write(head + b"%x\r\n" % len(event) + event + b"\r\n")
                head = b""
        self._write(head + b"0\r\n\r\n")


async def serve_raw(engine_url: str, port: int, stream_interval: int) -> None:
    http = EngineHTTP(timeout_s=60, connect_timeout_s=5)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: RawFloor(engine_url, stream_interval, http), "127.0.0.1", port)
    async with server:
        await server.serve_forever()


async def _whole(send: Any, status: int, content: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(content)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": content})


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--raw"]
    interval = int(args[2]) if len(args) > 2 else 1
    if "--raw" in sys.argv:
        uvloop.run(serve_raw(args[0], int(args[1]), interval))  # the loop the gateway serves on
    else:
        uvicorn.run(
            app_for(args[0], interval), host="127.0.0.1", port=int(args[1]), log_level="warning", lifespan="off"
        )
