"""Server-sent-event framing shared by the provider renderers."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["SSE_HEADERS", "sse"]

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def sse(data: dict[str, Any] | str, event: str | None = None) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()
