"""A rollout process whose pipeline dies must not linger as a healthy-looking HTTP server: /health turns 503 and
``python -m rollout`` exits non-zero, so a supervisor restarts it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from eventbus import KafkaSettings
from rollout.settings import RolloutSettings

pytestmark = pytest.mark.integration


def test_a_dead_pipeline_exits_the_process_with_an_error(
    kafka_settings: KafkaSettings, rollout_settings: RolloutSettings, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOE_")}
    env.update(
        {
            "FLOE_KAFKA_BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers,
            # Kafka refuses this topic name, so the pipeline fails inside its run loop (after the HTTP server is up).
            "FLOE_ROLLOUT_TOPIC_SUFFIX": ".bad/name",
            "FLOE_ROLLOUT_HTTP_PORT": str(rollout_settings.http_port),
            "FLOE_ROLLOUT_DATASET_DIR": str(tmp_path / "dataset"),
            "FLOE_ROLLOUT_CLAIM_URL": str(tmp_path / "claims"),
        }
    )
    done = subprocess.run(
        [sys.executable, "-m", "rollout"], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "critical task died; the service stops" in done.stdout + done.stderr
