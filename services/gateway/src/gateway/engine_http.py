"""A small HTTP/1.1 client for the one hop on the gateway's hot path: gateway -> engine.

Why not httpx: on that hop httpx (httpcore, h11, anyio, sniffio) cost ~6 ms of CPU per 16-token streamed call, most of
it per SSE chunk, more than everything else the gateway does per call together (``bench/gateway``). This client is an
``asyncio.Protocol`` with httptools' C parser (the one uvicorn uses) and does only what the engine hop needs:

- ``request(method, url, body)`` -> ``Response`` once the status line and headers are in; ``Response.read()`` the
  whole body, ``Response.lines()`` its lines as they arrive (SSE), ``Response.aclose()``.
- Keep-alive pool per (scheme, host, port); ``https`` URLs use the system's trust store. A connection goes back to
  the pool only when its response was read to the end and both sides allow keep-alive; a response closed early
  closes its connection. Idle connections expire after
  ``keepalive_s``, under uvicorn's default server-side 5 s, so the engine rarely closes one we are about to use.
- A pooled connection that fails before any response byte arrived (the engine closed it while idle) is retried
  once on a new connection: the engine cannot have answered, so nothing is sent twice to a client.
- A connection closed mid-answer (its client left, so the engine must stop sampling) is replaced in the background
  when no other one is idle for that engine: the session's next call then finds a connection ready instead of
  waiting for a TCP connect (``bench/gateway``, TTFT with probes that hang up).
- Timeouts: ``connect_timeout_s`` for the TCP connect, ``timeout_s`` for each wait on the engine (headers, or the
  next body bytes) -- the same meaning as httpx's read timeout.

Errors are ``ConnectFailed`` (the engine did not accept a connection: fail over to another replica), ``Timeout`` and
``TransportError`` (the connection broke or the engine sent something that is not HTTP/1.1).
"""

from __future__ import annotations

import asyncio
import functools
import ssl
import time
from collections.abc import AsyncGenerator
from typing import cast
from urllib.parse import urlsplit

import httptools

__all__ = ["ConnectFailed", "EngineHTTP", "HTTPError", "Response", "Timeout", "TransportError"]

_PAUSE_ABOVE = 1 << 20  # buffered body bytes above which the socket stops being read until the consumer catches up


_Key = tuple[str, str, int]  # scheme, host, port


class HTTPError(Exception):
    """Any failure of an engine request."""


class ConnectFailed(HTTPError):
    """No connection: refused, unreachable, or the connect timed out."""


class Timeout(HTTPError):
    """The engine sent nothing for ``timeout_s``."""


class TransportError(HTTPError):
    """The connection broke mid-request, or the bytes were not valid HTTP/1.1."""


class _Stale(TransportError):
    """A reused connection closed before any response byte: safe to send again on a new one."""


class _Connection(asyncio.Protocol):
    """One TCP connection and the one response being read on it (HTTP/1.1, no pipelining)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._parser: httptools.HttpResponseParser | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._deadline = 0.0
        self._error: HTTPError | None = None
        self._paused = False
        self._reused = False
        self._got_bytes = False
        self.status = 0
        self.headers: dict[str, str] = {}
        self.headers_done = False
        self.body: list[bytes] = []
        self.body_len = 0
        self.complete = False
        self.keep_alive = False

    # --- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's

    def data_received(self, data: bytes) -> None:
        if self._parser is None:  # bytes while idle: the engine must not send any; the connection is unusable
            self._fail(TransportError("engine sent bytes outside a response"))
            return
        self._got_bytes = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(TransportError(f"engine sent invalid HTTP: {exc}"))
            return
        if self.body_len > _PAUSE_ABOVE and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._parser is not None and not self.complete:
            msg = f"engine closed the connection ({exc!r})" if exc else "engine closed the connection"
            self._fail(_Stale(msg) if self._reused and not self._got_bytes else TransportError(msg))

    # --- httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        assert self._parser is not None
        self.status = self._parser.get_status_code()
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.body.append(body)
        self.body_len += len(body)

    def on_message_complete(self) -> None:
        assert self._parser is not None
        self.complete = True
        self.keep_alive = self._parser.should_keep_alive()

    # --- used by EngineHTTP and Response

    def start(self, request: bytes, *, reused: bool) -> None:
        assert self.transport is not None
        self._parser = httptools.HttpResponseParser(self)
        self._reused, self._got_bytes = reused, False
        self.status, self.headers, self.headers_done = 0, {}, False
        self.body, self.body_len, self.complete, self.keep_alive = [], 0, False, False
        self._error = None
        self.transport.write(request)

    def take_body(self) -> list[bytes]:
        out, self.body, self.body_len = self.body, [], 0
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return out

    async def wait(self, timeout_s: float) -> None:
        """Until more bytes were parsed, the connection failed (raises), or ``timeout_s`` passed (raises)."""
        if self._error is not None:
            raise self._error
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        self._deadline = loop.time() + timeout_s
        if self._timer is not None and self._timer.when() > self._deadline:  # a shorter timeout than the last wait's
            self._timer.cancel()
            self._timer = None
        if self._timer is None:
            # One timer per connection, moved on lazily when it fires early, instead of a timer armed and cancelled
            # per wait: a streamed call waits once per token.
            self._timer = loop.call_at(self._deadline, self._check_deadline)
        try:
            await waiter
        finally:
            self._waiter = None
        if self._error is not None:
            raise self._error

    def _check_deadline(self) -> None:
        self._timer = None
        waiter = self._waiter
        if waiter is None or waiter.done() or self.closed:
            return  # no wait in progress: the next one arms a timer again
        loop = asyncio.get_running_loop()
        if loop.time() < self._deadline:
            self._timer = loop.call_at(self._deadline, self._check_deadline)
            return
        waiter.set_exception(Timeout("engine sent nothing in time"))
        self.close()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _fail(self, error: HTTPError) -> None:
        self._error = self._error or error
        self.close()
        self._wake()

    def close(self) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.transport is not None:
            self.transport.close()


class Response:
    """A response whose status and headers are in; the body is read with ``read`` or ``lines`` (once)."""

    def __init__(self, client: EngineHTTP, key: _Key, conn: _Connection, timeout_s: float) -> None:
        self._client, self._key, self._conn, self._timeout_s = client, key, conn, timeout_s
        self.status = conn.status
        self.headers = conn.headers
        self._done = False

    async def _chunks(self) -> AsyncGenerator[bytes, None]:
        conn = self._conn
        while True:
            parts = conn.take_body()
            if parts:  # more may have arrived while these were consumed: take again before waiting or finishing
                for part in parts:
                    yield part
                continue
            if conn.complete:
                self._finish()
                return
            await conn.wait(self._timeout_s)

    async def read(self) -> bytes:
        return b"".join([part async for part in self._chunks()])

    async def lines(self) -> AsyncGenerator[bytes, None]:
        """The body's lines without their line end, as they arrive; a last line without one comes at the end."""
        rest = b""
        async for part in self._chunks():
            if rest:
                part = rest + part
            *whole, rest = part.split(b"\n")
            for line in whole:
                yield line[:-1] if line.endswith(b"\r") else line
        if rest:
            yield rest

    def _finish(self) -> None:
        if not self._done:
            self._done = True
            self._client._release(self._key, self._conn)

    async def aclose(self) -> None:
        """Give the connection back when the body was read to its end, else close it (the engine stops the work)."""
        if not self._done:
            self._done = True
            self._conn.close()
            self._client._replace(self._key)


# Cached: the gateway asks a handful of URLs (each replica's few paths) on every call. A bad URL raises and is not kept.
@functools.lru_cache(maxsize=1024)
def _target(url: str) -> tuple[_Key, str, str]:
    """``url``'s connection key (scheme, host, port), request target (path and query) and host header."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConnectFailed(f"engine URL {url!r} is not http(s)://host[:port]")
    key = (parts.scheme, parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))
    return key, (parts.path or "/") + (f"?{parts.query}" if parts.query else ""), parts.netloc


class EngineHTTP:
    """Requests to the engine replicas over pooled keep-alive connections."""

    def __init__(
        self,
        *,
        timeout_s: float,
        connect_timeout_s: float,
        keepalive_s: float = 4.0,
        max_idle_per_host: int = 128,
    ) -> None:
        self._timeout_s = timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._keepalive_s = keepalive_s
        self._max_idle = max_idle_per_host
        self._idle: dict[_Key, list[_Connection]] = {}
        self._refills: dict[_Key, asyncio.Task[None]] = {}
        self._closed = False
        self._tls: ssl.SSLContext | None = None

    async def request(
        self, method: str, url: str, body: bytes | None = None, *, content_type: str = "application/json"
    ) -> Response:
        key, target, netloc = _target(url)
        head = f"{method} {target} HTTP/1.1\r\nhost: {netloc}\r\naccept: */*\r\n"
        if body is not None:
            head += f"content-type: {content_type}\r\ncontent-length: {len(body)}\r\n"
        request = head.encode("latin-1") + b"\r\n" + (body or b"")
        conn = self._pooled(key)
        if conn is not None:
            try:
                return await self._send(key, conn, request, reused=True)
            except _Stale:
                pass  # closed by the engine while idle: the request was never read; send it on a new connection
        return await self._send(key, await self._connect(key), request, reused=False)

    async def _send(self, key: _Key, conn: _Connection, request: bytes, *, reused: bool) -> Response:
        conn.start(request, reused=reused)
        try:
            while not conn.headers_done:
                await conn.wait(self._timeout_s)
        except BaseException:
            conn.close()
            raise
        return Response(self, key, conn, self._timeout_s)

    def _pooled(self, key: _Key) -> _Connection | None:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < self._keepalive_s:
                return conn
            conn.close()
        return None

    async def _connect(self, key: _Key) -> _Connection:
        loop = asyncio.get_running_loop()
        scheme, host, port = key
        tls = None
        if scheme == "https":
            tls = self._tls = self._tls or ssl.create_default_context()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(_Connection, host, port, ssl=tls), self._connect_timeout_s
            )
        except (OSError, TimeoutError) as exc:
            raise ConnectFailed(f"cannot connect to {host}:{port}: {exc!r}") from exc
        return conn

    def _release(self, key: _Key, conn: _Connection) -> None:
        if conn.closed or not conn.keep_alive:
            conn.close()
            return
        conn._parser = None
        conn.idle_since = time.monotonic()
        idle = self._idle.setdefault(key, [])
        if len(idle) >= self._max_idle:
            conn.close()
            return
        idle.append(conn)

    def _replace(self, key: _Key) -> None:
        """Open a connection to ``key`` in the background for the pool, unless one is idle or already opening."""
        if self._closed or self._idle.get(key) or key in self._refills:
            return
        task = asyncio.get_running_loop().create_task(self._refill(key))
        self._refills[key] = task
        task.add_done_callback(lambda _: self._refills.pop(key, None))

    async def _refill(self, key: _Key) -> None:
        try:
            conn = await self._connect(key)
        except ConnectFailed:
            return  # nothing to keep ready: the next request connects itself and reports what it meets
        idle = self._idle.setdefault(key, [])
        if self._closed or conn.closed or len(idle) >= self._max_idle:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        idle.append(conn)

    async def aclose(self) -> None:
        self._closed = True
        for task in list(self._refills.values()):
            task.cancel()
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()
