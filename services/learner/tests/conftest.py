"""Shared fixtures: a tiny random Qwen2 model on disk (built once per session) and batch helpers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from eventbus import configure_logging

from .synthetic import save_tiny_model

# Configure structlog once, now, against the session's stderr: configure_logging binds the stream it sees first,
# and a test's capsys stream is closed after that test (the CLI test calls configure_logging too).
configure_logging("learner-tests")

# The test machine is shared and small: one intra-op thread is ~10x faster than two contended ones for tiny models.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny-model"), seed=0)
