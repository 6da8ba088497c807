"""Host side of the bridge: a Unix socket that forwards every connection to one TCP endpoint (the gateway's port).

The sandbox has no network (its own netns with only loopback). Its launcher (``sandbox_init.py``) listens on
``127.0.0.1:<port>`` and forwards to this socket, which is bind-mounted into the sandbox; we forward to the
upstream (TCP). So the sandboxed program reaches exactly one endpoint and nothing else: TCP -> UDS -> TCP. The
socket file is made connectable by the sandbox's uid (0666) inside the sandbox's private run directory.
``SandboxProcess`` starts one for a spec with a ``Bridge`` and closes it with the sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

import structlog

__all__ = ["UnixBridge"]

log = structlog.get_logger()


class UnixBridge:
    """Serve ``socket_path``; each connection is piped to ``(host, port)``. Closing stops every pipe."""

    def __init__(self, socket_path: Path, host: str, port: int) -> None:
        self.socket_path = socket_path
        self.host = host
        self.port = port
        self._server: asyncio.AbstractServer | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self.connections = 0

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._handle, path=str(self.socket_path))
        os.chmod(self.socket_path, 0o666)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        except OSError as exc:
            log.warning("bridge upstream unreachable", host=self.host, port=self.port, error=str(exc))
            writer.close()
            return
        tasks = [
            asyncio.create_task(_pipe(reader, up_writer)),
            asyncio.create_task(_pipe(up_reader, writer)),
        ]
        self._pipes.update(tasks)
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            self._pipes.difference_update(tasks)
            for w in (writer, up_writer):
                w.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._pipes):
                task.cancel()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), timeout=2.0)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass
