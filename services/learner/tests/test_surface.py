"""Public surface, settings and the offline CLI."""

from __future__ import annotations

import json
import random

import pytest
from pydantic import ValidationError

import learner
from contracts import to_ipc
from learner import LearnerSettings
from learner.cli import main

from .synthetic import prefix_merging_rows, synthetic_sessions


def test_exported_members_are_curated():
    exported = {name for name in dir(learner) if not name.startswith("_")}
    modules = {"checkpoint", "data", "distributed", "grpo", "model", "settings", "train", "cli"}
    assert exported - modules == set(learner.__all__)


def test_settings_from_env_with_polar_defaults(monkeypatch, tmp_path):
    monkeypatch.setenv("FLOE_LEARNER_MODEL_DIR", str(tmp_path / "m"))
    monkeypatch.setenv("FLOE_LEARNER_CHECKPOINT_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("FLOE_LEARNER_LOSS_AGG", "session-mean")
    s = LearnerSettings()
    assert (s.lr, s.betas, s.weight_decay, s.clip_low, s.clip_high, s.kl_coef) == (
        1e-6,
        (0.9, 0.98),
        0.1,
        0.2,
        0.28,
        1e-3,
    )
    assert s.loss_agg == "session-mean" and s.max_staleness == 3
    assert s.micro_batch_layout == "packed"
    monkeypatch.setenv("FLOE_LEARNER_MICRO_BATCH_LAYOUT", "padded")
    assert LearnerSettings().micro_batch_layout == "padded"
    monkeypatch.setenv("FLOE_LEARNER_MICRO_BATCH_LAYOUT", "varlen")
    with pytest.raises(ValidationError, match="micro_batch_layout"):
        LearnerSettings()
    monkeypatch.delenv("FLOE_LEARNER_MICRO_BATCH_LAYOUT")
    monkeypatch.setenv("FLOE_LEARNER_LOSS_AGG", "sum-everything")
    with pytest.raises(ValidationError):
        LearnerSettings()
    with pytest.raises(ValidationError):
        LearnerSettings(model_dir=tmp_path, checkpoint_dir=tmp_path, clip_low=1.5)
    monkeypatch.setenv("FLOE_LEARNER_LOSS_AGG", "token-mean")
    monkeypatch.setenv("FLOE_LEARNER_LEARNING_RATE", "0.1")  # misspelt: the knob is FLOE_LEARNER_LR
    with pytest.raises(ValidationError, match="FLOE_LEARNER_LEARNING_RATE"):
        LearnerSettings()


def test_cli_train_files_prints_one_json_line_per_step(tiny_model_dir, tmp_path, capsys):
    f = tmp_path / "only.arrow"
    f.write_bytes(to_ipc(prefix_merging_rows(synthetic_sessions(1, 2, 2, random.Random(0)))))
    rc = main(["train-files", "--model-dir", str(tiny_model_dir), "--checkpoint-dir", str(tmp_path / "c"), str(f)])
    assert rc == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    steps = [x for x in lines if x.get("batch_id") == "only" and "version" in x and "loss" in x]
    assert steps and steps[-1]["version"] == 1
    assert (tmp_path / "c" / "v00000001" / "model.safetensors").exists()


def test_topic_settings_default_to_the_registry_and_the_old_batches_name_still_works(monkeypatch, tmp_path):
    from structlog.testing import capture_logs

    from contracts import TRAJECTORY_BATCHES, WEIGHTS

    monkeypatch.setenv("FLOE_LEARNER_MODEL_DIR", str(tmp_path / "m"))
    monkeypatch.setenv("FLOE_LEARNER_CHECKPOINT_DIR", str(tmp_path / "c"))
    s = LearnerSettings()
    assert (s.trajectory_batches_topic, s.weights_topic) == (TRAJECTORY_BATCHES.name, WEIGHTS.name)
    monkeypatch.setenv("FLOE_LEARNER_BATCHES_TOPIC", "old.spelling")  # the name before TRAJECTORY_BATCHES_TOPIC
    with capture_logs() as logs:
        assert LearnerSettings().trajectory_batches_topic == "old.spelling"
        assert LearnerSettings(batches_topic="kwarg").trajectory_batches_topic == "kwarg"
    deprecated = [e["name"] for e in logs if e["event"] == "deprecated_setting"]
    assert deprecated == ["FLOE_LEARNER_BATCHES_TOPIC", "batches_topic"]
    monkeypatch.setenv("FLOE_LEARNER_TRAJECTORY_BATCHES_TOPIC", "new.spelling")
    assert LearnerSettings().trajectory_batches_topic == "new.spelling"  # the new name wins
