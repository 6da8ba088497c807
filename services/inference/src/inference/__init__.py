"""floe inference: a CPU engine speaking vLLM's token-level OpenAI API, with weight hot-reload.

See ``services/inference/README.md`` for the API (request/response examples) and ``deploy/vllm/`` for the GPU profile.

The names below are imported on first use (PEP 562): ``floe model …`` and ``floe serve inference --engine vllm``
import submodules of this package and must not pay for torch and transformers (over a minute on a loaded 2-core
machine) when they never touch them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inference.app import WEIGHT_VERSION_HEADER, create_app
    from inference.checkpoint import Checkpoint, DevModelSpec, init_dev_model, load_checkpoint, save_checkpoint
    from inference.engine import Engine
    from inference.settings import InferenceSettings

__all__ = [
    "WEIGHT_VERSION_HEADER",
    "Checkpoint",
    "DevModelSpec",
    "Engine",
    "InferenceSettings",
    "create_app",
    "init_dev_model",
    "load_checkpoint",
    "save_checkpoint",
]

_HOMES = {
    "WEIGHT_VERSION_HEADER": "inference.app",
    "create_app": "inference.app",
    "Checkpoint": "inference.checkpoint",
    "DevModelSpec": "inference.checkpoint",
    "init_dev_model": "inference.checkpoint",
    "load_checkpoint": "inference.checkpoint",
    "save_checkpoint": "inference.checkpoint",
    "Engine": "inference.engine",
    "InferenceSettings": "inference.settings",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'inference' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later lookups skip this function
    return value
