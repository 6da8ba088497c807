"""floe inference: a CPU engine speaking vLLM's token-level OpenAI API, with weight hot-reload.

See ``services/inference/README.md`` for the API (request/response examples) and ``deploy/vllm/`` for the GPU profile.
"""

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
