"""``--engine vllm``: start vLLM (``deploy/vllm/serve.sh``) as the private backend of floe's inference service.

Role: the gateway only knows a base URL, a served model name and a port, so the inference service keeps the CPU
engine's (``vllm_proxy`` listens there); vLLM itself listens on 127.0.0.1 only, on ``FLOE_INFERENCE_VLLM_PORT`` (a
free port by default), because dev mode exposes its administrative endpoints (``/pause``, ``/collective_rpc``).
``vllm_overrides(settings, port)`` maps ``InferenceSettings`` onto serve.sh's ``FLOE_VLLM_*`` variables (model
directory, port, served name, max logprobs, max model length); every other ``FLOE_VLLM_*`` variable (device, GPU
memory, ...) passes through from the environment.

``VllmProcess.start`` launches serve.sh in its own process group, with the parent-death signal set (``setpriv
--pdeathsig``, when present) so a killed proxy does not leave a vLLM behind, and waits for ``GET /health``; a vLLM
that exits first, or is not healthy in time, is an error that says so. ``wait()`` returns only by raising, when vLLM
exits: the app runs it as a critical task, so the service exits 1 with it and a supervisor restarts both together
(a vLLM restarted alone would come back on its start weights under the proxy's newer version).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import time
from pathlib import Path
from typing import NoReturn

import httpx
import structlog

from inference.settings import InferenceSettings

__all__ = ["VllmLaunchError", "VllmProcess", "check_model_dir", "find_serve_script", "vllm_overrides"]

log = structlog.get_logger()

SERVE_SCRIPT = Path("deploy") / "vllm" / "serve.sh"
VLLM_HOST = "127.0.0.1"  # never exposed: the reload endpoints of dev mode are administrative


class VllmLaunchError(RuntimeError):
    """vLLM cannot be started as configured, or stopped running; the message says what is missing or happened."""


def find_serve_script(settings: InferenceSettings, start: Path | None = None) -> Path:
    """``settings.vllm_serve_script``, else serve.sh in the nearest checkout above ``start`` (cwd) or this file."""
    if settings.vllm_serve_script is not None:
        if not settings.vllm_serve_script.is_file():
            raise VllmLaunchError(f"FLOE_INFERENCE_VLLM_SERVE_SCRIPT={settings.vllm_serve_script}: no such file")
        return settings.vllm_serve_script
    for base in ((start or Path.cwd()).resolve(), Path(__file__).resolve().parent):
        for directory in (base, *base.parents):
            if (directory / SERVE_SCRIPT).is_file():
                return directory / SERVE_SCRIPT
    raise VllmLaunchError(
        f"cannot find {SERVE_SCRIPT} above {start or Path.cwd()} or {Path(__file__).parent}; run from a floe checkout "
        "or set FLOE_INFERENCE_VLLM_SERVE_SCRIPT"
    )


def check_model_dir(settings: InferenceSettings) -> Path:
    """The absolute checkpoint directory (vLLM's working directory may differ), or the error saying how to get one."""
    model = settings.model_dir.resolve()
    if not (model / "config.json").is_file():
        raise VllmLaunchError(
            f"no checkpoint at {model} (config.json missing); vLLM needs a real checkpoint: "
            "`floe model fetch smollm2-135m`, then --model smollm2-135m or FLOE_INFERENCE_MODEL_DIR=<printed path>"
        )
    return model


def vllm_overrides(settings: InferenceSettings, port: int) -> dict[str, str]:
    """serve.sh's variables for these settings, vLLM listening on ``127.0.0.1:port``."""
    env = {
        "FLOE_VLLM_MODEL": str(check_model_dir(settings)),
        "FLOE_VLLM_HOST": VLLM_HOST,
        "FLOE_VLLM_PORT": str(port),
        "FLOE_VLLM_SERVED_MODEL_NAME": settings.served_model_name,
        "FLOE_VLLM_MAX_LOGPROBS": str(settings.max_logprobs),
    }
    if settings.max_model_len is not None:
        env["FLOE_VLLM_MAX_MODEL_LEN"] = str(settings.max_model_len)
    return env


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((VLLM_HOST, 0))
        return int(sock.getsockname()[1])


class VllmProcess:
    """A vLLM started by serve.sh, in its own process group (see the module docstring)."""

    def __init__(self, proc: asyncio.subprocess.Process, url: str) -> None:
        self.proc = proc
        self.url = url
        self.start_s = 0.0

    @classmethod
    async def start(cls, settings: InferenceSettings) -> VllmProcess:
        script = find_serve_script(settings)
        port = settings.vllm_port or _free_port()
        overrides = vllm_overrides(settings, port)
        argv = ["bash", str(script)]
        setpriv = shutil.which("setpriv")
        if setpriv is not None:
            argv = [setpriv, "--pdeathsig", "TERM", *argv]
        started = time.monotonic()
        # Its stdout/stderr are ours: vLLM's log lines land in this service's log.
        proc = await asyncio.create_subprocess_exec(*argv, env={**os.environ, **overrides}, start_new_session=True)
        self = cls(proc, f"http://{VLLM_HOST}:{port}")
        log.info("vllm_starting", url=self.url, pid=proc.pid, model=overrides["FLOE_VLLM_MODEL"], script=str(script))
        try:
            await self._wait_healthy(settings.vllm_start_timeout_s)
        except BaseException:
            await self.stop()
            raise
        self.start_s = time.monotonic() - started
        log.info("vllm_ready", url=self.url, pid=proc.pid, start_s=round(self.start_s, 1))
        return self

    async def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient(base_url=self.url, timeout=5.0) as client:
            while True:
                if self.proc.returncode is not None:
                    raise VllmLaunchError(
                        f"vLLM (serve.sh, pid {self.proc.pid}) exited with {self.proc.returncode} before it was "
                        f"healthy at {self.url}; its output is in this service's log"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get("/health")).status_code == 200:
                        return
                if time.monotonic() > deadline:
                    raise VllmLaunchError(
                        f"vLLM not healthy at {self.url} after {timeout_s:.0f} s (FLOE_INFERENCE_VLLM_START_TIMEOUT_S)"
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.proc.wait(), 1.0)

    async def wait(self) -> NoReturn:
        """Raise ``VllmLaunchError`` when vLLM exits (for any reason: it never exits on its own while healthy)."""
        code = await self.proc.wait()
        raise VllmLaunchError(f"vLLM (pid {self.proc.pid}, {self.url}) exited with {code}")

    async def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM to its process group (the engine core and workers too), SIGKILL after ``timeout_s``."""
        if self.proc.returncode is not None:
            # vLLM exited by itself: whatever it left in its group (engine core, workers) is an orphan.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            try:
                await asyncio.wait_for(self.proc.wait(), timeout_s)
                return
            except TimeoutError:
                log.warning("vllm_stop_timeout", pid=self.proc.pid, signal=sig.name)
