"""structlog JSON logging, configured once per process.

``configure_logging("gateway")`` makes every ``structlog.get_logger()`` call (and the stdlib ``logging`` records of
libraries such as uvicorn) write one JSON object per line to stderr, with ``service``, ``level``, ``timestamp`` and
any context bound with ``structlog.contextvars.bind_contextvars(session_id=...)``. Messages are constant strings;
variables go in key/value pairs. Calling it again is a no-op (the first service name wins), so libraries and tests
may call it freely.

``Repeats`` thins out runs of one line: the Kafka clients report every failed reconnect while a broker is down
(about 40 lines a second per service in a five-second broker restart of ``tests/e2e/test_fault_tolerance.py``,
which buried the one line that said what went wrong). The first line of a run goes out; the same line again within
``window_s`` is counted instead, and the next one after the window carries ``repeated=<count>``.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import structlog

__all__ = ["Repeats", "configure_logging"]

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


# librdkafka's lines differ only in how long a connection lasted or how many it suppressed itself.
_VARYING = re.compile(
    r"\(after \d+ms in state [A-Z_]+(, \d+ identical error\(s\) suppressed)?\)|\d+ identical error\(s\) suppressed"
)


class Repeats:
    """Which lines of a run of identical ones to let through (see the module docstring). Thread-safe: librdkafka
    logs from its own threads. Bounded: at most ``max_lines`` distinct lines are remembered."""

    def __init__(
        self, window_s: float = 10.0, max_lines: int = 512, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.window_s = window_s
        self._max = max_lines
        self._clock = clock
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[float, int]] = {}  # line -> (when it last went out, repeats counted since)

    def admit(self, line: str) -> int | None:
        """None: drop this line (a repeat within the window); else how many repeats were dropped before it."""
        key = _VARYING.sub("", line)
        now = self._clock()
        with self._lock:
            last = self._seen.get(key)
            if last is not None and now - last[0] < self.window_s:
                self._seen[key] = (last[0], last[1] + 1)
                return None
            if last is None and len(self._seen) >= self._max:
                self._seen = {k: v for k, v in self._seen.items() if now - v[0] < self.window_s}
                if len(self._seen) >= self._max:
                    self._seen.clear()
            self._seen[key] = (now, 0)
            return 0 if last is None else last[1]

    def emit(self, write: Callable[..., Any], line: str, event: str, **fields: Any) -> None:
        """``write(event, **fields)`` unless ``line`` is a repeat within the window; with ``repeated=<n>`` when
        repeats were dropped before it."""
        repeated = self.admit(line)
        if repeated is None:
            return
        if repeated:
            fields["repeated"] = repeated
        write(event, **fields)
