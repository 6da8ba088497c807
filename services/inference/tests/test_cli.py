"""``floe inference init-model`` creates the same checkpoint every time, loadable by the engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inference.checkpoint import load_checkpoint
from inference.cli import main


def test_init_model_is_deterministic(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("a", "b"):
        assert main(["init-model", "--out", str(tmp_path / name), "--hidden-size", "32", "--version", "3"]) == 0
    info = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert info["version"] == 3 and info["spec"]["hidden_size"] == 32
    for f in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
    ckpt = load_checkpoint(tmp_path / "a")
    assert ckpt.version == 3 and ckpt.model.config.hidden_size == 32
    assert load_checkpoint(tmp_path / "a", version=9).version == 9


def test_init_model_requires_out() -> None:
    with pytest.raises(SystemExit):
        main(["init-model"])
