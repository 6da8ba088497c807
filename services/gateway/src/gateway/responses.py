"""The two responses a provider call answers with: whole JSON, or a stream of server-sent events.

Both are Starlette ``Response`` subclasses (so FastAPI and the front door's fast lane treat them alike), built for the
hot path:

- ``json_response``: the body serialized once by pydantic-core (compact, UTF-8 as is), instead of ``JSONResponse``'s
  ``json.dumps``.
- ``EventStream``: sends each chunk its body iterator yields as it comes. Starlette's ``StreamingResponse`` runs the
  stream and a disconnect listener in an anyio task group (two tasks, cancel scopes) on servers before ASGI 2.4, as
  uvicorn is; this one runs the stream in the request's own task and watches for the client leaving from one small
  task. When the client leaves, the stream is cancelled where it waits (for the engine, usually) and its iterator is
  closed: the turn sees ``CancelledError`` or ``GeneratorExit`` and is not recorded, as before. A chunk that is a
  ``protocols.sse.Lead`` waits for the next chunk that is not, and goes out in the same write. Once ``settled()``
  is true (the turn is recorded: what the iterator still yields is the stream's tail, finish and usage events,
  ``[DONE]``, ``message_stop``...), every chunk is held and the tail goes out in one write with the end of the body,
  instead of one write (a syscall, and a wake-up of the client) per event.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from pydantic_core import to_json
from starlette.background import BackgroundTask
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gateway.protocols.sse import Lead

__all__ = ["EventStream", "json_response"]


def json_response(content: Any, status_code: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    return Response(to_json(content), status_code=status_code, headers=headers, media_type="application/json")


class EventStream(Response):
    """A streamed response (``text/event-stream`` unless told) whose chunks go out as its iterator yields them."""

    def __init__(
        self,
        chunks: AsyncIterator[bytes],
        *,
        media_type: str = "text/event-stream",
        headers: Mapping[str, str] | None = None,
        settled: Callable[[], bool] = lambda: False,
    ) -> None:
        self.body_iterator = chunks
        self._settled = settled
        self.status_code = 200
        self.media_type = media_type
        self.background: BackgroundTask | None = None
        self.init_headers(headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        assert task is not None
        state = {"ended": False, "left": False}

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            if not state["ended"]:  # the server also answers http.disconnect once the response is complete
                state["left"] = True
                task.cancel()

        watcher = asyncio.get_running_loop().create_task(watch())
        chunks = self.body_iterator
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            held = b""
            settled = self._settled
            async for chunk in chunks:
                if type(chunk) is Lead or settled():
                    held += chunk
                    continue
                if held:
                    chunk, held = held + chunk, b""
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            state["ended"] = True
            await send({"type": "http.response.body", "body": held, "more_body": False})
        except asyncio.CancelledError:
            if not state["left"]:
                raise
            task.uncancel()  # our own cancellation, for a client that left: the request ends normally
        finally:
            state["ended"] = True
            watcher.cancel()
            closer = getattr(chunks, "aclose", None)
            if closer is not None:
                await closer()
