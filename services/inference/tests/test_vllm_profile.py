"""The vLLM profile in ``deploy/vllm`` agrees with the CPU engine's settings (it cannot run here, so check flags)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml

from inference import InferenceSettings

DEPLOY = Path(__file__).resolve().parents[3] / "deploy" / "vllm"


def dry_run(**env: str) -> list[str]:
    out = subprocess.run(
        ["bash", str(DEPLOY / "serve.sh")],
        env={**os.environ, "FLOE_VLLM_DRY_RUN": "1", **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return out.stdout.splitlines()


def flag(argv: list[str], name: str) -> str:
    assert name in argv, f"{name} missing from the vllm command line"
    return argv[argv.index(name) + 1]


def test_serve_flags_match_inference_settings() -> None:
    settings = InferenceSettings(_env_file=None)  # type: ignore[call-arg]
    argv = dry_run()
    assert argv[:2] == ["vllm", "serve"]
    assert flag(argv, "--served-model-name") == settings.served_model_name
    assert int(flag(argv, "--port")) == settings.port
    assert int(flag(argv, "--max-logprobs")) == settings.max_logprobs
    assert flag(argv, "--tool-call-parser") == "hermes"
    assert "--enable-auto-tool-choice" in argv
    assert flag(argv, "--reasoning-parser") == "qwen3"
    # Same logprob semantics as the CPU engine: raw model distribution.
    assert flag(argv, "--logprobs-mode") == "raw_logprobs"
    assert flag(argv, "--generation-config") == "vllm"
    # Token ids are requested per call (return_token_ids); the global rewrite of token strings stays off.
    assert "--return-tokens-as-token-ids" not in argv


def test_serve_flags_follow_env_overrides() -> None:
    argv = dry_run(FLOE_VLLM_PORT="9001", FLOE_VLLM_SERVED_MODEL_NAME="qwen", FLOE_VLLM_MODEL="/ckpt/x")
    assert argv[2] == "/ckpt/x" and flag(argv, "--port") == "9001" and flag(argv, "--served-model-name") == "qwen"


def test_reload_script_drains_reloads_and_always_resumes() -> None:
    script = (DEPLOY / "reload_weights.sh").read_text()
    steps = ["/pause?mode=wait", "trap 'post /resume' EXIT", '"method": "reload_weights"', "/reset_prefix_cache"]
    positions = [script.index(s) for s in steps]
    assert positions == sorted(positions), "reload steps out of order"
    assert 'VLLM_SERVER_DEV_MODE="${VLLM_SERVER_DEV_MODE:-1}"' in (DEPLOY / "serve.sh").read_text()


def test_compose_gpu_profile_uses_the_same_port_and_name() -> None:
    settings = InferenceSettings(_env_file=None)  # type: ignore[call-arg]
    compose = yaml.safe_load((DEPLOY.parents[1] / "docker-compose.yml").read_text())["services"]
    svc = compose["vllm"]
    assert svc["profiles"] == ["gpu"]
    # floe's proxy in front of vLLM listens where the CPU engine does, under its name (vLLM itself is private).
    assert svc["command"] == ["python", "-m", "inference", "--engine", "vllm"]
    assert svc["environment"]["FLOE_INFERENCE_PORT"] == str(settings.port)
    assert svc["environment"]["FLOE_INFERENCE_SERVED_MODEL_NAME"] == settings.served_model_name
    # It answers under the CPU engine's name on the compose network, so the gateway config is the same.
    assert "inference" in svc["networks"]["default"]["aliases"]
    assert compose["inference"]["environment"]["FLOE_INFERENCE_PORT"] == str(settings.port)
