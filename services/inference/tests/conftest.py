"""Fixtures: the tiny dev checkpoint (built once per session) and a real uvicorn server on a free port."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

from eventbus import KafkaSettings
from eventbus.serving import serve_in_thread
from inference import InferenceSettings, create_app, init_dev_model


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


running_app = serve_in_thread  # any ASGI app under uvicorn in a thread; yields its base URL


@contextmanager
def running_server(
    settings: InferenceSettings, kafka: KafkaSettings | None = None, factory: Callable[..., Any] = create_app
) -> Iterator[str]:
    """Run the real app (``factory``: the CPU engine's, or ``create_vllm_app``) in a thread; yields its base URL."""
    port = free_port()
    settings = settings.model_copy(update={"port": port})
    with running_app(factory(settings, kafka=kafka), port) as url:
        yield url


@pytest.fixture(scope="session")
def dev_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_dev_model(tmp_path_factory.mktemp("dev-model") / "v0")


@pytest.fixture(scope="session")
def make_settings(dev_model_dir: Path) -> Callable[..., InferenceSettings]:
    def make(**overrides: Any) -> InferenceSettings:
        base: dict[str, Any] = {
            "model_dir": dev_model_dir,
            "consume_weights": False,
            "init_if_missing": False,
            "threads": 1,
            "seed": 1234,
            "max_model_len": 4096,
        }
        base.update(overrides)
        return InferenceSettings(**base)

    return make


@pytest.fixture(scope="module")
def base_url(make_settings: Callable[..., InferenceSettings]) -> Iterator[str]:
    with running_server(make_settings()) as url:
        yield url


@pytest.fixture(scope="session")
def serve() -> Callable[..., Any]:
    """``with serve(settings, kafka=None, factory=create_app) as url:`` — a real server with its own settings."""
    return running_server


def _teacher_forced_logprobs(model: Any, prompt: list[int], completion: list[int]) -> list[float]:
    """One forward pass over prompt+completion, no cache, no padding: the logprob of each completion token."""
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt + completion])).logits[0].float()  # (T, V)
    logprobs = torch.log_softmax(logits, dim=-1)
    start = len(prompt) - 1  # position t predicts token t+1
    return [float(logprobs[start + i, tok]) for i, tok in enumerate(completion)]


@pytest.fixture(scope="session")
def teacher_forced_logprobs() -> Callable[..., list[float]]:
    return _teacher_forced_logprobs
