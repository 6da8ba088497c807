"""configure_logging: JSON lines on stderr with service/level/timestamp, bound context, idempotent."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = r"""
import logging, structlog
from eventbus import configure_logging
configure_logging("gateway")
configure_logging("other")  # idempotent: the first call wins, no duplicate handlers
log = structlog.get_logger()
structlog.contextvars.bind_contextvars(session_id="s-1")
log.info("call recorded", topic="floe.model-calls", partition=3, offset=9)
log.debug("hidden at INFO")
logging.getLogger("uvicorn.error").warning("stdlib %s", "record")
"""


def test_json_lines_with_service_and_context() -> None:
    # A subprocess: logging configuration is process-global and must not leak into other tests.
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout == ""
    lines = [json.loads(line) for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 2, done.stderr
    first, second = lines
    assert first["event"] == "call recorded"
    assert first["service"] == "gateway" and first["level"] == "info" and first["session_id"] == "s-1"
    assert (first["topic"], first["partition"], first["offset"]) == ("floe.model-calls", 3, 9)
    assert first["timestamp"].endswith("Z")
    assert second["event"] == "stdlib record" and second["service"] == "gateway" and second["level"] == "warning"
