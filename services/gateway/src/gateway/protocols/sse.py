"""Server-sent-event framing shared by the provider renderers."""

from __future__ import annotations

from typing import Any

from pydantic_core import to_json

__all__ = ["SSE_HEADERS", "Lead", "sse"]

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def sse(data: dict[str, Any] | str, event: str | None = None) -> bytes:
    # pydantic-core's serializer: compact, UTF-8 as is, ~3x json.dumps per chunk (one chunk per sampled token)
    payload = data.encode() if isinstance(data, str) else to_json(data)
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + payload + b"\n\n"


class Lead(bytes):
    """An event that only announces content (a role chunk, ``message_start``, ``content_block_start``,
    ``response.created``...): ``gateway.responses.EventStream`` holds it back and sends it in one write with the next
    event that is not a lead. The client reads the same bytes in the same order; the first token's write carries the
    announcements before it instead of following them, one wake-up of the client later."""
