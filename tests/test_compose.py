"""docker-compose.yml and the Dockerfiles must match the code (no Docker engine runs here, so we parse them).

Checks: every build context and Dockerfile exists and installs the package of the service it builds; every
``python -m X`` command names a runnable package; every ``floe …`` command parses; every ``FLOE_*`` variable is a
field of the settings class that reads its prefix (pydantic-settings would reject or ignore a misspelt one).
"""

from __future__ import annotations

import importlib
import inspect
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic_settings import BaseSettings

ROOT = Path(__file__).resolve().parents[1]
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
PACKAGES = ["inference", "gateway", "sessions", "scorer", "rollout", "learner", "dashboard"]
# The gateway's proxy runs inside the gateway-node image (services/sessions/Dockerfile), which installs it.
SHIPPED_IN = {"gateway": "sessions"}
SETTINGS_MODULES = ["eventbus.settings", *(f"{p}.settings" for p in PACKAGES)]


def _settings_by_prefix() -> dict[str, type[BaseSettings]]:
    found: dict[str, type[BaseSettings]] = {}
    for module_name in SETTINGS_MODULES:
        module = importlib.import_module(module_name)
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, BaseSettings) and obj is not BaseSettings and obj.__module__ == module_name:
                prefix = obj.model_config.get("env_prefix", "")
                if prefix:
                    found[prefix.upper()] = obj
    return found


def _environment(svc: dict[str, Any]) -> dict[str, str]:
    env = svc.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


@pytest.mark.parametrize("name", sorted(n for n, s in SERVICES.items() if "build" in s))
def test_build_context_and_dockerfile_match_the_service(name: str) -> None:
    build = SERVICES[name]["build"]
    context = ROOT / build["context"]
    dockerfile = context / build["dockerfile"]
    assert context.is_dir() and dockerfile.is_file(), f"{name}: {dockerfile} missing"
    svc_dir = dockerfile.parent
    package = svc_dir.name
    text = dockerfile.read_text()
    assert f"--package floe-{package}" in text, f"{dockerfile} does not install floe-{package}"
    assert re.search(rf'CMD \["python", "-m", "{package}"\]', text), f"{dockerfile} does not run {package}"
    assert (svc_dir / "src" / package / "__main__.py").is_file(), f"{package} has no __main__"


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_commands_exist(name: str) -> None:
    command = SERVICES[name].get("command")
    if not command:
        return
    if command[:2] == ["python", "-m"]:
        module = command[2]
        spec = importlib.util.find_spec(f"{module}.__main__")
        assert spec is not None, f"{name}: python -m {module} has no __main__"
    elif command[0] == "floe":
        floe = Path(sys.executable).parent / "floe"
        proc = subprocess.run([str(floe), *command[1:], "--help"], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, f"{name}: `{' '.join(command)}` is not a floe command: {proc.stderr[-500:]}"
    else:
        pytest.fail(f"{name}: unexpected command {command}")


def test_every_floe_variable_is_a_settings_field() -> None:
    by_prefix = _settings_by_prefix()
    assert "FLOE_KAFKA_" in by_prefix and "FLOE_GATEWAY_" in by_prefix
    for name, svc in SERVICES.items():
        for var in _environment(svc):
            if not var.startswith("FLOE_"):
                continue
            if var.startswith("FLOE_VLLM_"):  # read by deploy/vllm/serve.sh, not by a settings class
                assert var in (ROOT / "deploy" / "vllm" / "serve.sh").read_text(), f"{name}: serve.sh ignores {var}"
                continue
            prefix = next((p for p in sorted(by_prefix, key=len, reverse=True) if var.startswith(p)), None)
            assert prefix is not None, f"{name}: {var} has no settings class"
            field = var[len(prefix) :].lower()
            assert field in by_prefix[prefix].model_fields, f"{name}: {var} is not a field of {by_prefix[prefix]}"


def test_gpu_profile_runs_the_weight_following_proxy_in_front_of_vllm() -> None:
    # The gpu profile's engine is floe's inference service in vLLM mode (proxy + weight follower + vLLM as its child,
    # deploy/vllm/README.md): same port and alias as the CPU engine, in an image that has the vLLM venv.
    vllm = SERVICES["vllm"]
    assert vllm["profiles"] == ["gpu"]
    assert vllm["command"] == ["python", "-m", "inference", "--engine", "vllm"]
    assert "inference" in vllm["networks"]["default"]["aliases"]
    env = _environment(vllm)
    assert env["FLOE_VLLM_DEVICE"] == "cuda" and env["FLOE_INFERENCE_HOST"] == "0.0.0.0"
    gateway_urls = _environment(SERVICES["gateway"])["FLOE_GATEWAY_ENGINE_URLS"]
    assert f"http://inference:{env['FLOE_INFERENCE_PORT']}" in gateway_urls
    assert "FLOE_KAFKA_BOOTSTRAP_SERVERS" in env  # it consumes floe.weights
    dockerfile = (ROOT / vllm["build"]["context"] / vllm["build"]["dockerfile"]).read_text()
    assert "deploy/vllm/venv.sh" in dockerfile and "FLOE_VLLM_DEVICE=cuda" in dockerfile
    assert "vllm serve" in (ROOT / "deploy" / "vllm" / "serve.sh").read_text()


def test_the_engines_read_the_learners_checkpoints_at_the_path_it_publishes() -> None:
    # WeightsPublished.uri is a path inside the learner's container: every engine must mount it at the same place.
    checkpoints = _environment(SERVICES["learner"])["FLOE_LEARNER_CHECKPOINT_DIR"]
    learner_mounts = {m.split(":")[1]: m.split(":")[0] for m in SERVICES["learner"]["volumes"]}
    mount = next(target for target in learner_mounts if checkpoints.startswith(target))
    for name in ("inference", "vllm"):
        mounts = {m.split(":")[1]: m.split(":")[0] for m in SERVICES[name]["volumes"]}
        assert mounts.get(mount) == learner_mounts[mount], f"{name} does not see {checkpoints}"


def test_every_service_package_has_a_compose_service() -> None:
    built = {Path(s["build"]["dockerfile"]).parent.name for s in SERVICES.values() if "build" in s}
    assert {SHIPPED_IN.get(p, p) for p in PACKAGES} <= built


@pytest.mark.parametrize("name", [*(p for p in PACKAGES if p not in SHIPPED_IN.values()), "vllm"])
def test_services_restart_after_a_crash(name: str) -> None:
    # Services are crash-only (a dead pipeline exits non-zero; state comes back from Kafka): compose must restart them.
    assert SERVICES[name].get("restart") in {"on-failure", "unless-stopped", "always"}
