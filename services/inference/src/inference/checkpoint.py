"""Checkpoint directories: create the tiny development model, load any Qwen2/Qwen3-style checkpoint.

Role: a checkpoint is a directory in Hugging Face layout (``config.json``, ``model.safetensors``, tokenizer files,
``chat_template.jinja``) plus an optional ``floe.json`` with the weight version. ``AutoTokenizer`` and
``AutoModelForCausalLM`` load it as is, so the learner and our engine read the same files.

Limits: CPU and float32 only (the engine's faithfulness guarantee is stated for float32); no sharded-index handling
beyond what ``from_pretrained`` does itself.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, PreTrainedModel, Qwen2Config
from transformers.utils import logging as hf_logging

from inference.reloader import VERSION_FILE, read_version
from inference.tokenizer import Tokenizer
from inference.tokenizer_build import CONTROL_TOKENS, build_tokenizer

__all__ = [
    "VERSION_FILE",
    "Checkpoint",
    "DevModelSpec",
    "init_dev_model",
    "load_checkpoint",
    "load_model",
    "load_tokenizer",
    "read_version",
    "save_checkpoint",
]


@dataclass(frozen=True)
class DevModelSpec:
    """Sizes of the random-init development model (Qwen2 architecture)."""

    hidden_size: int = 64
    intermediate_size: int = 192
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 32768
    vocab_size: int = 2048
    seed: int = 0


@dataclass
class Checkpoint:
    """A loaded checkpoint: model in eval mode on CPU, its tokenizer, and the weight version it carries."""

    path: Path
    model: PreTrainedModel
    tokenizer: Tokenizer
    version: int


def _write_version(path: Path, version: int, extra: dict[str, Any] | None = None) -> None:
    (path / VERSION_FILE).write_text(json.dumps({"version": version, **(extra or {})}, indent=2) + "\n")


def init_dev_model(out: Path, spec: DevModelSpec | None = None, *, version: int = 0) -> Path:
    """Create the tiny development checkpoint deterministically (same spec -> byte-identical weights).

    The model appears whole or not at all: it is written to a sibling temporary directory and renamed into place, so
    a reader that waits for ``config.json`` (the learner in compose, with a shared volume) never loads half a model,
    and two writers racing (two engine replicas) both end with the same complete model. A directory that already
    holds a model is rewritten in place, as asked.
    """
    spec = spec or DevModelSpec()
    had_model = (out / "config.json").exists()
    out.parent.mkdir(parents=True, exist_ok=True)
    # A random name: replicas in containers can share a pid (1) as well as the volume.
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    tmp.chmod(0o755)  # mkdtemp's 0700 would follow the rename
    _write_dev_model(tmp, spec, version)
    try:
        if out.is_dir() and not any(out.iterdir()):
            out.rmdir()  # an empty mount point or a directory made in advance
        tmp.rename(out)
    except OSError:
        if had_model or not (out / "config.json").exists():
            # Rewriting an existing model, or a non-empty directory without one: write in place. Otherwise another
            # writer renamed its (identical) model into place first, and ours is dropped.
            _write_dev_model(out, spec, version)
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _write_dev_model(out: Path, spec: DevModelSpec, version: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(build_tokenizer(out, vocab_size=spec.vocab_size, seed=spec.seed))
    vocab = len(tokenizer)
    eos_ids = [tokenizer.token_id(t) or 0 for t in ("<|im_end|>", "<|endoftext|>")]
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_ids,
        pad_token_id=tokenizer.token_id(CONTROL_TOKENS[0]),
        dtype="float32",
    )
    # Seed the global RNG only for the duration of init so the weights depend on nothing but the spec.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    gen_config = GenerationConfig(eos_token_id=eos_ids, pad_token_id=config.pad_token_id)  # type: ignore[no-untyped-call]
    model.generation_config = gen_config
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    model.save_pretrained(str(out), safe_serialization=True)
    _write_version(out, version, {"base_model": "floe-dev-tiny", "spec": spec.__dict__})


def load_tokenizer(path: Path) -> Tokenizer:
    return Tokenizer(AutoTokenizer.from_pretrained(str(path)))


def load_model(path: Path) -> PreTrainedModel:
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # progress bars on stderr would interleave with our JSON logs
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, attn_implementation="sdpa")
    model.eval()  # type: ignore[no-untyped-call]
    model.requires_grad_(False)
    return model


def load_checkpoint(path: Path, *, version: int | None = None) -> Checkpoint:
    """Load a checkpoint; ``version`` overrides ``floe.json`` (which defaults to 0 when absent)."""
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"not a checkpoint directory (no config.json): {path}")
    resolved = version if version is not None else (read_version(path) or 0)
    return Checkpoint(path=path, model=load_model(path), tokenizer=load_tokenizer(path), version=resolved)


def save_checkpoint(model: PreTrainedModel, tokenizer_from: Path, out: Path, *, version: int) -> Path:
    """Write ``model`` as a new checkpoint directory, copying tokenizer files from ``tokenizer_from``.

    Used by tests and tools that publish changed weights; the learner writes the same layout.
    """
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
        src = tokenizer_from / name
        if src.exists():
            shutil.copyfile(src, out / name)
    _write_version(out, version)
    return out
