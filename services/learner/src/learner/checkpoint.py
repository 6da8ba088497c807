"""Checkpoints: one directory per weight version, written atomically, that inference engines load as-is.

Layout of ``<root>/v<version:08d>/``:

- ``model.safetensors`` (+ index if sharded) and ``config.json``: a plain Hugging Face checkpoint, loadable by
  ``AutoModelForCausalLM.from_pretrained(dir)``, by our CPU engine and by vLLM's ``reload_weights`` with
  ``weights_path=dir`` (this directory is the ``WeightsPublished.uri``). Tied embeddings are stored once, under the
  input embedding's name, as ``save_pretrained`` writes them and both engines expect;
- the tokenizer, chat template and generation files of the base model (``TOKENIZER_FILES``), copied, so
  ``AutoTokenizer.from_pretrained(dir)`` and the engines' chat templating see exactly the base model's;
- ``optimizer.pt``: the full AdamW state keyed by parameter name (``torch.distributed.checkpoint.state_dict``
  format), so a restart continues the optimisation exactly;
- ``floe.json``: ``{"version": N, ...}``, the version marker inference engines read;
- ``learner_state.json``: version, step, the ids of every batch applied so far (the exactly-once ledger) and the
  step's metrics.

Atomicity: everything is written into ``<root>/.tmp-v<version>-<pid>`` and fsynced, then renamed to its final name
(rename is atomic on POSIX). A reader therefore sees a complete version or none; leftover temp directories of a
killed writer are removed on the next start.

Only ``*.safetensors`` files at the top level are weights: vLLM's loader reads every one it finds there, so nothing
else (an adapter, an extra shard) may be written next to them.

Compatibility: ``check_compatible`` refuses a checkpoint whose architecture or tensor shapes differ from the base
model's (``CheckpointMismatchError``, naming both directories and each differing field), before any weights are read:
resuming a checkpoint dir left by another model must not train a mix of two models or fail deep inside torch.

Limits: weights are saved in fp32 (the master copy), which doubles disk and load time versus bf16 for inference
(SmolLM2-135M: 513 MiB of weights + 1 GiB of AdamW state per version).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import structlog
import torch
from torch import nn

__all__ = [
    "CheckpointMismatchError",
    "LearnerState",
    "check_compatible",
    "latest_checkpoint",
    "list_checkpoints",
    "prune",
    "read_state",
    "save_checkpoint",
    "wait_for_model",
]

log = structlog.get_logger()

STATE_FILE = "learner_state.json"
OPTIMIZER_FILE = "optimizer.pt"
# The weight version as the inference engines read it when no WeightsPublished names it (shared layout).
VERSION_FILE = "floe.json"
# What travels from the base model into every version, by name pattern: an allow-list, because a base model directory
# can hold files that must not be copied (the model cache's manifest, whose hashes would then lie; READMEs; weights).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
)
# config.json fields that decide the architecture and every tensor shape; a checkpoint must match the base model on
# all of them. Fields a model type lacks compare as None on both sides.
ARCHITECTURE_FIELDS = (
    "architectures",
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "tie_word_embeddings",
)


class CheckpointMismatchError(ValueError):
    """A checkpoint's architecture or shapes differ from the base model's; the message names both and the fields."""


@dataclass
class LearnerState:
    """What a restart needs besides tensors. ``applied_batches`` grows by one id per batch (ids are short strings;
    a million steps is tens of MB, far beyond any run we plan, so no truncation)."""

    version: int = 0
    step: int = 0
    applied_batches: list[str] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    base_model: str = ""
    trained_batch: str | None = None  # the batch that produced ``version`` (None for the base model)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> LearnerState:
        raw = json.loads(text)
        return cls(
            version=int(raw["version"]),
            step=int(raw["step"]),
            applied_batches=[str(b) for b in raw["applied_batches"]],
            metrics={str(k): float(v) for k, v in raw.get("metrics", {}).items()},
            base_model=str(raw.get("base_model", "")),
            trained_batch=raw.get("trained_batch"),
        )


def wait_for_model(model_dir: Path, timeout_s: float, *, poll_s: float = 1.0) -> None:
    """Return once ``model_dir`` holds a model (its ``config.json``), or raise after ``timeout_s``.

    A base model another service writes (compose's inference creates the dev model in the shared volume) appears
    whole: writers publish it by renaming a complete directory into place.
    """
    config = model_dir / "config.json"
    deadline = time.monotonic() + timeout_s
    if not config.exists() and timeout_s > 0:
        log.info("waiting_for_base_model", path=str(model_dir), timeout_s=timeout_s)
    while not config.exists():
        if time.monotonic() >= deadline:
            waited = f" after waiting {timeout_s:g} s" if timeout_s > 0 else ""
            raise FileNotFoundError(
                f"no base model at {model_dir} (no config.json){waited}: set FLOE_LEARNER_MODEL_DIR to a model "
                "directory, or FLOE_LEARNER_MODEL_WAIT_S to wait for one that another service writes"
            )
        time.sleep(poll_s)


def version_dir(root: Path, version: int) -> Path:
    return root / f"v{version:08d}"


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoint directories, oldest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith("v") and (p / STATE_FILE).is_file()]
    return sorted(found, key=lambda p: p.name)


def latest_checkpoint(root: Path) -> Path | None:
    found = list_checkpoints(root)
    return found[-1] if found else None


def read_state(path: Path) -> LearnerState:
    return LearnerState.from_json((path / STATE_FILE).read_text())


def architecture(model_dir: Path) -> dict[str, Any]:
    """The ``ARCHITECTURE_FIELDS`` of ``model_dir/config.json``."""
    config_path = model_dir / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointMismatchError(f"{config_path}: unreadable model config ({exc})") from exc
    return {name: config.get(name) for name in ARCHITECTURE_FIELDS}


def check_compatible(base_model_dir: Path, checkpoint: Path) -> None:
    """Raise ``CheckpointMismatchError`` unless ``checkpoint`` has the base model's architecture and shapes."""
    base, other = architecture(base_model_dir), architecture(checkpoint)
    diffs = [
        f"{k}: {other[k]!r} (checkpoint) vs {base[k]!r} (base model)"
        for k in ARCHITECTURE_FIELDS
        if base[k] != other[k]
    ]
    if diffs:
        raise CheckpointMismatchError(
            f"checkpoint {checkpoint} does not match the base model {base_model_dir}: {'; '.join(diffs)}. "
            "It was written for another model: point the checkpoint dir elsewhere, or the model dir at its base model"
        )


def clean_temp(root: Path) -> None:
    """Remove temp directories a killed writer left behind."""
    if root.is_dir():
        for p in root.iterdir():
            if p.name.startswith(".tmp-"):
                shutil.rmtree(p, ignore_errors=True)


def save_checkpoint(
    root: Path,
    state: LearnerState,
    model: nn.Module,
    model_state: dict[str, Any],
    optimizer_state: dict[str, Any],
    base_model_dir: Path,
) -> Path:
    """Write ``state.version`` atomically and return its final directory. Call on rank 0 with *full* state dicts."""
    root.mkdir(parents=True, exist_ok=True)
    final = version_dir(root, state.version)
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    save: Any = getattr(model, "save_pretrained", None)
    assert save is not None, "the policy must be a transformers PreTrainedModel"
    save(str(tmp), state_dict=model_state)
    _copy_tokenizer_files(base_model_dir, tmp)
    (tmp / VERSION_FILE).write_text(
        json.dumps({"version": state.version, "step": state.step, "base_model": state.base_model}, indent=2) + "\n"
    )
    torch.save(optimizer_state, tmp / OPTIMIZER_FILE)
    (tmp / STATE_FILE).write_text(state.to_json())
    _fsync_tree(tmp)
    if final.exists():
        # Same version written again (a crash after rename, before the Kafka commit): identical content by
        # construction, so replace it.
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(root)
    return final


def prune(root: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints; return what was deleted."""
    found = list_checkpoints(root)
    doomed = found[:-keep] if keep > 0 else []
    for p in doomed:
        shutil.rmtree(p, ignore_errors=True)
    return doomed


def _copy_tokenizer_files(src: Path, dst: Path) -> None:
    for name in TOKENIZER_FILES:
        # save_pretrained may have written one already (generation_config.json): the model's own copy wins.
        if (src / name).is_file() and not (dst / name).exists():
            shutil.copy2(src / name, dst / name)


def _fsync_tree(path: Path) -> None:
    for p in path.iterdir():
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    _fsync_dir(path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
