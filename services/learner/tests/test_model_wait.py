"""The learner waits for a base model that another service writes (compose: inference writes the dev model)."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import pytest

from learner.checkpoint import wait_for_model


def test_a_present_model_returns_at_once(tiny_model_dir: Path) -> None:
    started = time.monotonic()
    wait_for_model(tiny_model_dir, 0)
    wait_for_model(tiny_model_dir, 30)
    assert time.monotonic() - started < 1


def test_a_missing_model_without_a_wait_fails_naming_the_settings(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as err:
        wait_for_model(tmp_path / "nowhere", 0)
    message = str(err.value)
    assert str(tmp_path / "nowhere") in message
    assert "FLOE_LEARNER_MODEL_DIR" in message and "FLOE_LEARNER_MODEL_WAIT_S" in message
    assert "after waiting" not in message


def test_a_missing_model_fails_after_the_wait(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(FileNotFoundError, match=r"after waiting 0\.3 s"):
        wait_for_model(tmp_path / "nowhere", 0.3, poll_s=0.05)
    assert time.monotonic() - started >= 0.3


def test_a_model_renamed_into_place_while_waiting_is_seen(tiny_model_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "model"

    def publish() -> None:
        time.sleep(0.3)
        staged = tmp_path / ".model.tmp"
        shutil.copytree(tiny_model_dir, staged)
        staged.rename(target)

    writer = threading.Thread(target=publish)
    writer.start()
    started = time.monotonic()
    wait_for_model(target, 30, poll_s=0.05)
    writer.join()
    assert 0.3 <= time.monotonic() - started < 5
    assert (target / "config.json").exists()
