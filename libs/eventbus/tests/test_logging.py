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


def test_repeats_lets_the_first_line_of_a_run_through_and_counts_the_rest() -> None:
    from eventbus.logging import Repeats

    now = [0.0]
    repeats = Repeats(window_s=10.0, clock=lambda: now[0])
    refused = "FAIL [floe#consumer-6] [thrd:b/bootstrap]: b: Connect to ipv4#127.0.0.1:1 failed: Connection refused"
    admitted = []
    for i in range(100):  # one failed reconnect every 50 ms for 5 s, as during a broker restart
        now[0] = i * 0.05
        admitted.append(repeats.admit(f"{refused} (after {i % 3}ms in state CONNECT)"))
    assert admitted[0] == 0
    assert admitted[1:] == [None] * 99
    assert repeats.admit("a different line") == 0
    now[0] = 10.5
    assert repeats.admit(f"{refused} (after 0ms in state CONNECT, 1 identical error(s) suppressed)") == 99
    assert repeats.admit(f"{refused} (after 0ms in state CONNECT)") is None


def test_repeats_stays_bounded() -> None:
    from eventbus.logging import Repeats

    repeats = Repeats(max_lines=8, clock=lambda: 0.0)
    assert all(repeats.admit(f"line {i}") == 0 for i in range(100))
    assert len(repeats._seen) <= 8
