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

    python bench/gateway/floor.py ENGINE_URL PORT [STREAM_INTERVAL]
"""

from __future__ import annotations

import json
import sys
from typing import Any

import uvicorn

from gateway.engine_http import EngineHTTP

Scope = dict[str, Any]


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
        if path == "/healthz":
            await _whole(send, 200, b'{"ok":true}')
            return
        if path == "/admin/sessions":
            await _whole(send, 200, b'{"token":"floor"}')
            return
        if path != "/v1/chat/completions":
            await _whole(send, 404, b'{"error":"not found"}')
            return
        if http is None:
            http = EngineHTTP(timeout_s=60, connect_timeout_s=5)
        body = json.loads(b"".join(parts))
        body.update(return_token_ids=True, logprobs=True, top_logprobs=0)
        stream = bool(body.get("stream"))
        if stream:
            body["stream_options"] = {"include_usage": True}
            if stream_interval > 1:
                body["stream_interval"] = stream_interval
        r = await http.request("POST", engine_url + path, json.dumps(body).encode())
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


async def _whole(send: Any, status: int, content: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(content)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": content})


if __name__ == "__main__":
    interval = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    uvicorn.run(
        app_for(sys.argv[1], interval), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning", lifespan="off"
    )
