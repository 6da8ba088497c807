"""``python -m inference`` as a real server process for the sessions' end-to-end tests."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from eventbus.broker import free_port


@contextlib.contextmanager
def cpu_engine_process(env: dict[str, str], log_path: Path, start_timeout_s: float = 300) -> Iterator[str]:
    """Start floe's CPU engine with ``env`` (``FLOE_INFERENCE_*`` on top of this process's environment) on a free
    port, wait until ``/v1/models`` answers, yield its URL, and stop it (SIGTERM, then SIGKILL) afterwards."""
    port = free_port()
    full = {**os.environ, **env, "FLOE_INFERENCE_PORT": str(port)}
    with log_path.open("wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "inference"], env=full, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"inference engine did not start; see {log_path}")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
