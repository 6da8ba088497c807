"""The engine hop's HTTP client (``gateway.engine_http``) against real servers on loopback sockets.

The servers are raw asyncio TCP servers that write HTTP/1.1 by hand, so each test controls exactly what arrives and
when: a body split into many small chunked pieces, a connection the server closes while it is idle in the pool, a
server that never answers, one that answers with ``Connection: close``.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from gateway.engine_http import ConnectFailed, EngineHTTP, Response, Timeout, TransportError

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def tcp_server(handler: Handler) -> AsyncIterator[tuple[str, list[int]]]:
    """``(url, connections)``: ``connections`` gets one entry per accepted TCP connection."""
    accepted: list[int] = []

    async def on_conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        try:
            await handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(on_conn, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", accepted
    finally:
        server.close()
        await server.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0
    )
    return await reader.readexactly(length)


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


async def sse_server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Keep-alive; each request gets 50 SSE events, written as separate chunks in bursts, then the terminator."""
    while True:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for i in range(50):
            writer.write(chunk(f"data: {i}\n\n".encode()))
            if i % 7 == 0:
                await writer.drain()
                await asyncio.sleep(0)
        writer.write(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await writer.drain()


async def test_every_line_arrives_though_bytes_come_while_the_consumer_is_busy() -> None:
    """Bursts land while the consumer is suspended between lines; none may be lost or reordered, and the whole body
    being read returns the connection to the pool (the second request reuses it)."""
    http = EngineHTTP(timeout_s=5, connect_timeout_s=2)
    async with tcp_server(sse_server) as (url, accepted):
        for _ in range(2):
            resp = await http.request("POST", url + "/v1/chat/completions", b"{}")
            got = []
            async for line in resp.lines():
                if line:
                    got.append(line.decode())
                    await asyncio.sleep(0.001)  # a slow consumer: the socket keeps filling meanwhile
            await resp.aclose()
            assert got == [f"data: {i}" for i in range(50)] + ["data: [DONE]"]
        assert len(accepted) == 1
    await http.aclose()


async def first_line_only(http: EngineHTTP, url: str) -> Response:
    """A streamed response of which only the first line is read (a client that leaves mid-answer)."""
    resp = await http.request("POST", url + "/x", b"{}")
    async for _ in resp.lines():
        break
    return resp


async def test_a_response_closed_early_closes_its_connection_and_a_new_one_is_opened_ahead() -> None:
    """The half-read connection is not reused (closing it is how the engine learns to stop); its replacement is opened
    in the background, so the next request finds it ready and opens none itself."""
    http = EngineHTTP(timeout_s=5, connect_timeout_s=2)
    async with tcp_server(sse_server) as (url, accepted):
        resp = await first_line_only(http, url)
        await resp.aclose()
        for _ in range(200):  # the replacement's connect, in the background
            if len(accepted) == 2:
                break
            await asyncio.sleep(0.01)
        assert len(accepted) == 2, "no replacement connection was opened"
        resp = await http.request("POST", url + "/x", b"{}")
        assert len([line async for line in resp.lines() if line]) == 51
        await resp.aclose()
        assert len(accepted) == 2  # the request went out on the replacement
    await http.aclose()


async def test_no_replacement_once_the_client_is_closed_and_a_refused_one_leaves_nothing_behind() -> None:
    http = EngineHTTP(timeout_s=5, connect_timeout_s=2)
    async with tcp_server(sse_server) as (url, accepted):
        resp = await first_line_only(http, url)
        await http.aclose()
        await resp.aclose()
        await asyncio.sleep(0.2)
        assert len(accepted) == 1
    # An engine that went away: the background connect is refused, and that is no unhandled task error; the next
    # request meets the refusal itself and reports it.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    errors: list[dict[str, object]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: errors.append(ctx))
    http = EngineHTTP(timeout_s=5, connect_timeout_s=2)
    http._replace(("http", "127.0.0.1", port))
    await asyncio.sleep(0.2)
    with pytest.raises(ConnectFailed):
        await http.request("POST", f"http://127.0.0.1:{port}/x", b"{}")
    await http.aclose()
    assert errors == []


async def test_a_pooled_connection_the_server_closed_is_retried_on_a_new_one() -> None:
    """uvicorn closes idle keep-alive connections after 5 s; a request sent on one that is closing gets no byte
    back, and is sent again on a fresh connection instead of failing the call."""

    async def one_answer_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        body = await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        await asyncio.sleep(0.05)  # keep-alive was promised (no Connection: close), then the server hangs up

    http = EngineHTTP(timeout_s=5, connect_timeout_s=2)
    async with tcp_server(one_answer_then_close) as (url, accepted):
        for i in range(3):
            resp = await http.request("POST", url + "/echo", f"call {i}".encode())
            assert (resp.status, await resp.read()) == (200, f"call {i}".encode())
            await asyncio.sleep(0.2)  # the server has closed the pooled connection by now
        assert len(accepted) == 3
    await http.aclose()


async def test_connection_close_is_honoured_and_headers_are_read() -> None:
    async def close_after(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 503 Service Unavailable\r\nX-Floe-Weight-Version: 7\r\nconnection: close\r\n")
        writer.write(b"content-length: 4\r\n\r\nbusy")
        await writer.drain()

    http = EngineHTTP(timeout_s=5, connect_timeout_s=2)
    async with tcp_server(close_after) as (url, accepted):
        for _ in range(2):
            resp = await http.request("GET", url + "/v1/models")
            assert (resp.status, resp.headers["x-floe-weight-version"], await resp.read()) == (503, "7", b"busy")
        assert len(accepted) == 2
    await http.aclose()


async def test_silence_is_a_timeout_and_a_refused_port_a_connect_failure() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(5)

    http = EngineHTTP(timeout_s=0.3, connect_timeout_s=2)
    async with tcp_server(silent) as (url, _):
        with pytest.raises(Timeout):
            await http.request("POST", url + "/x", b"{}")
    with pytest.raises(ConnectFailed):
        await http.request("POST", url + "/x", b"{}")  # the server is gone: nothing listens on the port
    await http.aclose()


async def test_the_timeout_counts_from_the_last_bytes_not_from_the_first_wait() -> None:
    """Pieces 0.15 s apart with a 0.4 s timeout: none times out though the body takes longer than the timeout (the
    connection's one timer moves on as bytes arrive); then silence, and the wait ends with ``Timeout`` (the timer
    still fires once the engine stops sending)."""

    async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for i in range(6):
            writer.write(chunk(f"data: {i}\n\n".encode()))
            await writer.drain()
            await asyncio.sleep(0.15)
        await asyncio.sleep(5)  # silence

    http = EngineHTTP(timeout_s=0.4, connect_timeout_s=2)
    async with tcp_server(trickle) as (url, _):
        resp = await http.request("POST", url + "/x", b"{}")
        got: list[bytes] = []
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(Timeout):
            async with asyncio.timeout(4):
                async for line in resp.lines():
                    if line:
                        got.append(line)
        assert got == [f"data: {i}".encode() for i in range(6)]
        assert loop.time() - t0 > 0.9  # 6 pieces 0.15 s apart, then 0.4 s of silence
        await resp.aclose()
    await http.aclose()


async def test_a_connection_cut_mid_body_is_a_transport_error() -> None:
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + chunk(b"data: 1\n\n"))
        await writer.drain()

    http = EngineHTTP(timeout_s=5, connect_timeout_s=2)
    async with tcp_server(cut) as (url, _):
        resp = await http.request("POST", url + "/x", b"{}")
        with pytest.raises(TransportError):
            async for _ in resp.lines():
                pass
        await resp.aclose()
    await http.aclose()


async def test_bytes_that_are_not_http_are_a_transport_error() -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(1)

    http = EngineHTTP(timeout_s=5, connect_timeout_s=2)
    async with tcp_server(garbage) as (url, _):
        with pytest.raises(TransportError, match="invalid HTTP"):
            await http.request("POST", url + "/x", b"{}")
    await http.aclose()
