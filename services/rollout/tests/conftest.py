"""Fixtures of the rollout tests: simulated groups published to uuid-suffixed copies of every topic."""

from __future__ import annotations

import socket
import uuid
from pathlib import Path

import pytest

from rollout.settings import RolloutSettings


@pytest.fixture
def suffix() -> str:
    return f".t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def rollout_settings(tmp_path: Path, suffix: str) -> RolloutSettings:
    return RolloutSettings(
        topic_suffix=suffix,
        instance_id=f"rollout-{uuid.uuid4().hex[:8]}",
        group_id=f"rollout-{uuid.uuid4().hex[:8]}",
        dataset_dir=str(tmp_path / "dataset"),
        claim_url=str(tmp_path / "claims"),
        http_port=free_port(),
        tick_s=0.2,
        group_selection="off",
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
