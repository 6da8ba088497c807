"""structlog JSON logging, configured once per process.

``configure_logging("gateway")`` makes every ``structlog.get_logger()`` call (and the stdlib ``logging`` records of
libraries such as uvicorn) write one JSON object per line to stderr, with ``service``, ``level``, ``timestamp`` and
any context bound with ``structlog.contextvars.bind_contextvars(session_id=...)``. Messages are constant strings;
variables go in key/value pairs. Calling it again is a no-op (the first service name wins), so libraries and tests
may call it freely.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

__all__ = ["configure_logging"]

_configured: str | None = None


def configure_logging(service: str, level: str | int = "INFO") -> None:
    global _configured
    if _configured is not None:
        return
    _configured = service
    numeric = logging.getLevelName(level.upper()) if isinstance(level, str) else level
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")

    def add_service(_: Any, __: str, event_dict: dict[str, Any]) -> dict[str, Any]:
        event_dict.setdefault("service", service)
        return event_dict

    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        add_service,
    ]
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, structlog.processors.JSONRenderer()],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.WriteLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    # stdlib records (uvicorn, confluent_kafka's Python parts) go through the same JSON renderer.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.JSONRenderer(),
            ],
        )
    )
    handler.name = "floe-json"
    root = logging.getLogger()
    root.handlers[:] = [h for h in root.handlers if h.name != "floe-json"]
    root.addHandler(handler)
    root.setLevel(numeric)
