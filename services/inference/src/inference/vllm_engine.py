"""``--engine vllm``: run vLLM (``deploy/vllm/serve.sh``) as floe's inference service, with the CPU engine's settings.

Role: the gateway only knows a base URL, a served model name and a port, so vLLM must answer under the same ones as the
CPU engine. ``vllm_overrides(settings)`` maps ``InferenceSettings`` onto serve.sh's ``FLOE_VLLM_*`` variables (model
directory, host, port, served name, max logprobs, max model length) and ``exec_vllm`` replaces this process with
serve.sh, so signals and the exit status are vLLM's own, as with ``floe serve`` for every other service.

Limits: weight hot-reload from ``floe.weights`` is not wired for vLLM here (the CPU engine's reloader does not run);
``deploy/vllm/reload_weights.sh`` is the manual path. The CPU-only settings (batching, threads, seed) do not apply.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import NoReturn

from inference.settings import InferenceSettings

__all__ = ["VllmLaunchError", "exec_vllm", "find_serve_script", "vllm_overrides"]

SERVE_SCRIPT = Path("deploy") / "vllm" / "serve.sh"


class VllmLaunchError(RuntimeError):
    """vLLM cannot be started as configured; the message says what is missing and how to get it."""


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


def vllm_overrides(settings: InferenceSettings) -> dict[str, str]:
    """serve.sh's variables for these settings (absolute model path: vLLM's working directory may differ)."""
    model = settings.model_dir.resolve()
    if not (model / "config.json").is_file():
        raise VllmLaunchError(
            f"no checkpoint at {model} (config.json missing); vLLM needs a real checkpoint: "
            "`floe model fetch smollm2-135m`, then --model smollm2-135m or FLOE_INFERENCE_MODEL_DIR=<printed path>"
        )
    env = {
        "FLOE_VLLM_MODEL": str(model),
        "FLOE_VLLM_HOST": settings.host,
        "FLOE_VLLM_PORT": str(settings.port),
        "FLOE_VLLM_SERVED_MODEL_NAME": settings.served_model_name,
        "FLOE_VLLM_MAX_LOGPROBS": str(settings.max_logprobs),
    }
    if settings.max_model_len is not None:
        env["FLOE_VLLM_MAX_MODEL_LEN"] = str(settings.max_model_len)
    return env


def exec_vllm(settings: InferenceSettings) -> NoReturn:
    """Replace this process with serve.sh (the environment passes through, plus ``vllm_overrides``)."""
    script = find_serve_script(settings)
    overrides = vllm_overrides(settings)
    bash = shutil.which("bash")
    if bash is None:
        raise VllmLaunchError("bash not found; serve.sh needs it")
    os.execve(bash, [bash, str(script)], {**os.environ, **overrides})
