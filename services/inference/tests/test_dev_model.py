"""The dev checkpoint appears whole or not at all, and racing writers end with one identical model."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

from inference import init_dev_model
from inference.checkpoint import VERSION_FILE


def _digest(model_dir: Path) -> dict[str, str]:
    return {
        p.relative_to(model_dir).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(model_dir.rglob("*"))
        if p.is_file()
    }


def test_a_fresh_model_is_complete_readable_and_leaves_no_temporary(tmp_path: Path, dev_model_dir: Path) -> None:
    out = init_dev_model(tmp_path / "models" / "dev")
    assert (out / "config.json").exists()
    assert _digest(out) == _digest(dev_model_dir)  # deterministic: the session fixture is the same spec
    assert out.stat().st_mode & 0o777 == 0o755  # other containers (the learner runs as another user) read it
    assert [p.name for p in out.parent.iterdir()] == ["dev"]


def test_an_empty_directory_made_in_advance_is_filled(tmp_path: Path, dev_model_dir: Path) -> None:
    (tmp_path / "dev").mkdir()  # a volume's mount point
    out = init_dev_model(tmp_path / "dev")
    assert _digest(out) == _digest(dev_model_dir)
    assert [p.name for p in tmp_path.iterdir()] == ["dev"]


def test_an_existing_model_is_rewritten_in_place(tmp_path: Path, dev_model_dir: Path) -> None:
    out = init_dev_model(tmp_path / "dev")
    (out / "model.safetensors").write_bytes(b"damaged")
    init_dev_model(out, version=3)
    digest = _digest(out)
    assert digest["model.safetensors"] == _digest(dev_model_dir)["model.safetensors"]
    assert digest[VERSION_FILE] != _digest(dev_model_dir)[VERSION_FILE]
    assert [p.name for p in tmp_path.iterdir()] == ["dev"]


def test_racing_writers_end_with_one_identical_model(tmp_path: Path, dev_model_dir: Path) -> None:
    # Processes, as replicas are: the weights' seeded RNG is per process (threads would share one).
    script = (
        "import sys; from pathlib import Path; from inference import init_dev_model; init_dev_model(Path(sys.argv[1]))"
    )
    writers = [
        subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "dev")], stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    for w in writers:
        _, err = w.communicate(timeout=300)
        assert w.returncode == 0, err
    assert _digest(tmp_path / "dev") == _digest(dev_model_dir)
    assert [p.name for p in tmp_path.iterdir()] == ["dev"]
