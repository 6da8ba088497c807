"""``floe model fetch``: the cache is reused when intact, and every kind of damage is a clear error, never a hang.

A fake cache in tmp stands in for the real one (the real download and conversion are exercised by the ``vllm`` tests'
``real_model_dir`` fixture); the conversion step is replaced only where a test needs a fresh fetch.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import time
from pathlib import Path

import pytest

from inference import model_cli, models
from inference.models import MANIFEST_FILE, REQUIRED_FILES, ModelCacheError, fetch_model, manifest_files

NAME = "smollm2-135m"


def write_fake_checkpoint(cache: Path) -> Path:
    ckpt = cache / "models" / NAME / "checkpoint"
    ckpt.mkdir(parents=True)
    for name in REQUIRED_FILES:
        (ckpt / name).write_bytes(hashlib.sha256(name.encode()).digest() * 64)
    (ckpt / MANIFEST_FILE).write_text(json.dumps({"name": NAME, "files": manifest_files(ckpt)}))
    return ckpt


def fail_download(*_: object) -> None:
    raise AssertionError("must not download: the cache is there")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(models, "_download_gguf", fail_download)
    return tmp_path / "cache"


def test_intact_cache_is_reused_without_download(cache: Path) -> None:
    ckpt = write_fake_checkpoint(cache)
    result = fetch_model(NAME, cache, say=lambda _: None)
    assert result.path == ckpt and not result.fetched and result.seconds < 5


def test_truncated_file_names_the_file_and_the_fix(cache: Path) -> None:
    ckpt = write_fake_checkpoint(cache)
    weights = ckpt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ModelCacheError, match="truncated") as err:
        fetch_model(NAME, cache, say=lambda _: None)
    assert str(weights) in str(err.value) and f"floe model fetch {NAME} --force" in str(err.value)


def test_changed_bytes_fail_the_sha256_check(cache: Path) -> None:
    ckpt = write_fake_checkpoint(cache)
    weights = ckpt / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[7] ^= 0xFF  # same size, different content
    weights.write_bytes(bytes(data))
    with pytest.raises(ModelCacheError, match="sha256") as err:
        fetch_model(NAME, cache, say=lambda _: None)
    assert str(weights) in str(err.value)


def test_missing_tokenizer_file(cache: Path) -> None:
    ckpt = write_fake_checkpoint(cache)
    (ckpt / "tokenizer.json").unlink()
    with pytest.raises(ModelCacheError, match="missing") as err:
        fetch_model(NAME, cache, say=lambda _: None)
    assert str(ckpt / "tokenizer.json") in str(err.value) and "--force" in str(err.value)


def test_manifest_without_a_required_file(cache: Path) -> None:
    ckpt = write_fake_checkpoint(cache)
    (ckpt / "chat_template.jinja").unlink()
    manifest = json.loads((ckpt / MANIFEST_FILE).read_text())
    del manifest["files"]["chat_template.jinja"]
    (ckpt / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(ModelCacheError, match="not in the manifest"):
        fetch_model(NAME, cache, say=lambda _: None)


def test_checkpoint_without_manifest_or_with_a_broken_one(cache: Path) -> None:
    ckpt = write_fake_checkpoint(cache)
    (ckpt / MANIFEST_FILE).write_text("{not json")
    with pytest.raises(ModelCacheError, match="unreadable"):
        fetch_model(NAME, cache, say=lambda _: None)
    (ckpt / MANIFEST_FILE).unlink()
    with pytest.raises(ModelCacheError, match=f"{MANIFEST_FILE}: missing"):
        fetch_model(NAME, cache, say=lambda _: None)


def test_corrupted_gguf_is_refused_before_conversion(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gguf = cache / "models" / NAME / "source" / models.MODELS[NAME].gguf_name
    gguf.parent.mkdir(parents=True)
    gguf.write_bytes(b"GGUF" + b"\0" * 1000)  # e.g. a copy cut short
    monkeypatch.setattr(models, "_convert", fail_download)
    with pytest.raises(ModelCacheError, match="sha256") as err:
        fetch_model(NAME, cache, say=lambda _: None)
    assert str(gguf) in str(err.value) and "--force" in str(err.value)


def test_force_refetches_and_a_fresh_fetch_writes_a_verifiable_manifest(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_fake_checkpoint(cache)
    source = models.MODELS[NAME]

    def fake_download(src: models.ModelSource, dest: Path, say: object) -> None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(b"gguf bytes")

    def fake_convert(src: models.ModelSource, gguf: Path, out: Path) -> None:
        out.mkdir(parents=True)
        for name in REQUIRED_FILES:
            (out / name).write_text(f"converted {name}")

    monkeypatch.setattr(models, "_download_gguf", fake_download)
    monkeypatch.setattr(models, "_convert", fake_convert)
    # The fake GGUF cannot match the pinned hash; pin the fake's instead for this test.
    monkeypatch.setitem(
        models.MODELS,
        NAME,
        models.ModelSource(**{**source.__dict__, "gguf_sha256": hashlib.sha256(b"gguf bytes").hexdigest()}),
    )
    result = fetch_model(NAME, cache, force=True, say=lambda _: None)
    assert result.fetched and (result.path / "model.safetensors").read_text() == "converted model.safetensors"
    assert not list(result.path.parent.glob("checkpoint.tmp-*"))
    assert models.verify_checkpoint(result.path)["files"].keys() == set(REQUIRED_FILES)


def test_a_held_lock_times_out_with_the_lock_path(tmp_path: Path) -> None:
    lock = tmp_path / ".lock"
    with lock.open("a+") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)
        t0 = time.monotonic()
        with pytest.raises(ModelCacheError, match=str(lock)), models._locked(lock, lambda _: None, timeout_s=0.5):
            pass
        assert time.monotonic() - t0 < 5


def test_unknown_model_name(cache: Path) -> None:
    with pytest.raises(ModelCacheError, match="unknown model 'gpt-9'"):
        fetch_model("gpt-9", cache)


def test_cli_prints_the_path_or_the_error(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ckpt = write_fake_checkpoint(cache)
    assert model_cli.main(["--cache", str(cache), "fetch", NAME]) == 0
    assert capsys.readouterr().out.strip() == str(ckpt)
    assert model_cli.main(["--cache", str(cache), "path", NAME]) == 0
    (ckpt / "tokenizer_config.json").unlink()
    assert model_cli.main(["--cache", str(cache), "fetch", NAME]) == 1
    err = capsys.readouterr().err
    assert str(ckpt / "tokenizer_config.json") in err and f"floe model fetch {NAME} --force" in err
    assert model_cli.main(["--cache", str(cache / "empty"), "path", NAME]) == 1
