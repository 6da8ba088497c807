"""How vLLM is built and started: device-specific flags only, the venv cache key, and clear errors when a piece is
missing (the real build and server run in the ``vllm`` tests)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from inference import InferenceSettings
from inference.vllm_engine import VllmLaunchError, find_serve_script, vllm_overrides

DEPLOY = Path(__file__).resolve().parents[3] / "deploy" / "vllm"


def sh(script: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(script), *args], env={**os.environ, **env}, capture_output=True, text=True, timeout=60
    )


def dry_run(**env: str) -> list[str]:
    out = sh(DEPLOY / "serve.sh", FLOE_VLLM_DRY_RUN="1", **env)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def flag(argv: list[str], name: str) -> str:
    assert name in argv, f"{name} missing from {argv}"
    return argv[argv.index(name) + 1]


def test_cpu_and_cuda_differ_only_in_device_flags() -> None:
    cpu, cuda = dry_run(FLOE_VLLM_DEVICE="cpu"), dry_run(FLOE_VLLM_DEVICE="cuda")
    device_flags = {
        "--dtype",
        "--enforce-eager",
        "--max-model-len",
        "--tensor-parallel-size",
        "--gpu-memory-utilization",
    }

    def common(argv: list[str]) -> list[str]:
        out, skip = [], False
        for i, a in enumerate(argv):
            if skip:
                skip = False
            elif a in device_flags:
                skip = a != "--enforce-eager" and i + 1 < len(argv)
            else:
                out.append(a)
        return out

    assert common(cpu) == common(cuda)
    assert flag(cpu, "--dtype") == "float32" and "--enforce-eager" in cpu and flag(cpu, "--max-model-len") == "2048"
    assert "--gpu-memory-utilization" not in cpu
    assert flag(cuda, "--dtype") == "bfloat16" and "--enforce-eager" not in cuda
    assert flag(cuda, "--max-model-len") == "32768" and flag(cuda, "--gpu-memory-utilization") == "0.90"


def test_reasoning_parser_only_when_the_tokenizer_has_think_tokens(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text('{"added_tokens": [{"id": 1, "content": "<|im_start|>"}]}')
    assert "--reasoning-parser" not in dry_run(FLOE_VLLM_MODEL=str(tmp_path))
    (tmp_path / "tokenizer.json").write_text('{"added_tokens": [{"id": 9, "content": "<think>"}]}')
    assert flag(dry_run(FLOE_VLLM_MODEL=str(tmp_path)), "--reasoning-parser") == "qwen3"
    assert "--reasoning-parser" not in dry_run(FLOE_VLLM_MODEL=str(tmp_path), FLOE_VLLM_REASONING_PARSER="none")


def test_venv_is_keyed_by_device_and_pins(tmp_path: Path) -> None:
    copy = tmp_path / "vllm"
    shutil.copytree(DEPLOY, copy)
    env = {"FLOE_CACHE": str(tmp_path / "cache"), "FLOE_VLLM_DEVICE": "cpu"}
    first = sh(copy / "venv.sh", "--path", **env).stdout.strip()
    assert first == sh(copy / "venv.sh", "--path", **env).stdout.strip()
    assert first.startswith(str(tmp_path / "cache" / "vllm-venv-cpu-"))
    with (copy / "constraints-cpu.txt").open("a") as f:
        f.write("six==1.17.0\n")
    assert sh(copy / "venv.sh", "--path", **env).stdout.strip() != first
    cuda = sh(copy / "venv.sh", "--path", **{**env, "FLOE_VLLM_DEVICE": "cuda"}).stdout.strip()
    assert "/vllm-venv-cuda-" in cuda
    assert sh(copy / "venv.sh", "--path", **{**env, "FLOE_VLLM_DEVICE": "tpu"}).returncode == 2


def test_serve_without_a_vllm_says_how_to_build_one(tmp_path: Path) -> None:
    out = sh(
        DEPLOY / "serve.sh",
        FLOE_CACHE=str(tmp_path),
        FLOE_VLLM_DEVICE="cpu",
        FLOE_VLLM_MODEL=str(tmp_path),
        PATH="/usr/bin:/bin",  # no vllm on PATH
    )
    assert out.returncode == 2 and "make vllm" in out.stderr


def test_serve_without_a_checkpoint_names_the_directory(tmp_path: Path) -> None:
    fake = tmp_path / "vllm"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    out = sh(DEPLOY / "serve.sh", FLOE_VLLM_BIN=str(fake), FLOE_VLLM_MODEL=str(tmp_path / "none"))
    assert out.returncode == 2 and f"no checkpoint at {tmp_path / 'none'}" in out.stderr


def test_inference_settings_map_onto_serve_sh(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    settings = InferenceSettings(model_dir=tmp_path, port=8123, served_model_name="pol", max_model_len=1024)
    env = vllm_overrides(settings, 8124)
    assert env["FLOE_VLLM_MODEL"] == str(tmp_path.resolve())
    # vLLM listens privately (its dev-mode reload endpoints are administrative); the proxy takes the public port.
    assert env["FLOE_VLLM_HOST"] == "127.0.0.1" and env["FLOE_VLLM_PORT"] == "8124"
    assert env["FLOE_VLLM_SERVED_MODEL_NAME"] == "pol" and env["FLOE_VLLM_MAX_MODEL_LEN"] == "1024"
    assert env["FLOE_VLLM_MAX_LOGPROBS"] == str(settings.max_logprobs)
    assert find_serve_script(settings) == DEPLOY / "serve.sh"
    with pytest.raises(VllmLaunchError, match="no such file"):
        find_serve_script(InferenceSettings(vllm_serve_script=tmp_path / "nope.sh"))


def run_engine_vllm(**env: str) -> subprocess.CompletedProcess[str]:
    # A process of its own: `python -m inference` configures logging for good, which pytest's capture would break.
    return subprocess.run(
        [sys.executable, "-m", "inference", "--engine", "vllm"],
        env={**os.environ, "FLOE_INFERENCE_CONSUME_WEIGHTS": "false", "FLOE_INFERENCE_PORT": "0", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_engine_vllm_without_a_checkpoint_fails_with_the_fix(tmp_path: Path) -> None:
    out = run_engine_vllm(FLOE_INFERENCE_MODEL_DIR=str(tmp_path / "missing"))
    assert out.returncode == 2 and "floe model fetch smollm2-135m" in out.stderr


def test_engine_vllm_fails_naming_the_cause_when_vllm_dies_at_start(tmp_path: Path) -> None:
    # A vLLM that exits at once (a broken install, a bad flag): the proxy must not serve, and must exit non-zero so
    # a supervisor restarts it.
    (tmp_path / "config.json").write_text("{}")
    broken = tmp_path / "vllm"
    broken.write_text("#!/bin/sh\necho 'vllm: broken on purpose' >&2\nexit 3\n")
    broken.chmod(0o755)
    out = run_engine_vllm(FLOE_INFERENCE_MODEL_DIR=str(tmp_path), FLOE_VLLM_BIN=str(broken))
    assert out.returncode != 0, out.stderr[-2000:]  # uvicorn's startup failure (3)
    assert "broken on purpose" in out.stderr
    assert "exited with 3 before it was healthy" in out.stderr
