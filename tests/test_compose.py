"""docker-compose.yml and the Dockerfiles must match the code: checked here by parsing them, in the fast suite.

tests/e2e/test_compose_up.py runs the cpu profile for real (a Docker engine, images built here); these checks catch
the mistakes that test would take minutes to find, and those it cannot see: a duplicate YAML key PyYAML accepts and
compose v2 refuses, a public image that is only pulled, a workspace member a Dockerfile forgets. Checks: every build
context and Dockerfile exists and installs the package of the service it builds; every ``python -m X`` command names a
runnable package; every ``floe …`` command parses; every ``FLOE_*`` variable is a field of the settings class that
reads its prefix (pydantic-settings would reject or ignore a misspelt one).
"""

from __future__ import annotations

import importlib
import inspect
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic_settings import BaseSettings

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_TEXT = (ROOT / "docker-compose.yml").read_text()
COMPOSE: dict[str, Any] = yaml.safe_load(COMPOSE_TEXT)
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


class _StrictLoader(yaml.SafeLoader):
    """Refuses a key given twice in one mapping, as compose v2's YAML parser does (PyYAML keeps the last)."""


def _no_duplicate_keys(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    keys = [k.value for k, _ in node.value if isinstance(k, yaml.ScalarNode)]  # `<<` included: before merging
    duplicates = sorted({k for k in keys if keys.count(k) > 1})
    if duplicates:
        raise yaml.constructor.ConstructorError(None, None, f"duplicate keys {duplicates}", node.start_mark)
    return loader.construct_mapping(node)  # type: ignore[no-untyped-call]


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicate_keys)


def test_no_key_is_given_twice_in_a_mapping() -> None:
    # Two `<<:` merge keys in one mapping run under docker-compose 1.x and fail under `docker compose` (v2).
    yaml.load(COMPOSE_TEXT, Loader=_StrictLoader)


def test_the_only_image_not_built_here_is_the_brokers_with_a_local_build_beside_it() -> None:
    # Every other image is built from this repository, so `compose up` needs a registry for Kafka alone, and
    # compose-local.sh, for machines without one, builds that image too (deploy/kafka/Dockerfile).
    pulled = {name: svc["image"] for name, svc in SERVICES.items() if "build" not in svc}
    assert pulled == {"kafka": "${FLOE_KAFKA_IMAGE:-apache/kafka:4.1.1}"}
    local = (ROOT / "deploy" / "docker" / "compose-local.sh").read_text()
    assert 'FLOE_KAFKA_IMAGE="${FLOE_KAFKA_IMAGE:-floe/kafka:local}"' in local
    assert 'docker build -q -t "$FLOE_KAFKA_IMAGE"' in local and "deploy/kafka" in local
    assert (ROOT / "deploy" / "kafka" / "Dockerfile").is_file()
    # The local image's health check replaces the public image's script (the variable the kafka service reads).
    assert "${FLOE_KAFKA_HEALTHCHECK:-" in str(SERVICES["kafka"]["healthcheck"]["test"])
    assert "FLOE_KAFKA_HEALTHCHECK" in local and (ROOT / "deploy" / "kafka" / "docker" / "health.sh").is_file()


def _workspace_members() -> list[str]:
    root = tomllib.loads((ROOT / "pyproject.toml").read_text())
    members: list[str] = []
    for pattern in root["tool"]["uv"]["workspace"]["members"]:
        members += sorted(p.parent.relative_to(ROOT).as_posix() for p in ROOT.glob(f"{pattern}/pyproject.toml"))
    return members


CACHED_DOCKERFILES = sorted(
    p.relative_to(ROOT).as_posix()
    for p in ROOT.glob("services/*/Dockerfile")
    if "--no-install-workspace" in p.read_text()
)


@pytest.mark.parametrize("dockerfile", CACHED_DOCKERFILES)
def test_the_dependency_layer_sees_every_workspace_manifest(dockerfile: str) -> None:
    # `uv sync --frozen` checks the lock against every member's manifest: a member not copied fails the build.
    text = (ROOT / dockerfile).read_text()
    for member in _workspace_members():
        assert f"COPY {member}/pyproject.toml {member}/" in text, f"{dockerfile} does not copy {member}/pyproject.toml"


def test_every_service_dockerfile_caches_its_dependencies() -> None:
    assert set(CACHED_DOCKERFILES) == {f"services/{p}/Dockerfile" for p in PACKAGES if p not in SHIPPED_IN}


def test_the_engine_and_the_learner_share_their_torch_layer() -> None:
    # Identical instructions up to the dependency layer: Docker builds (and stores) torch once for both images.
    def head(name: str) -> list[str]:
        lines = [ln for ln in (ROOT / "services" / name / "Dockerfile").read_text().splitlines()]
        instructions = [ln for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
        return instructions[: next(i for i, ln in enumerate(instructions) if "--no-install-workspace" in ln) + 1]

    assert head("inference") == head("learner")


@pytest.mark.parametrize("name", sorted(n for n, s in SERVICES.items() if "build" in s))
def test_every_image_builds_from_the_base_image_compose_passes(name: str) -> None:
    # compose-local.sh swaps the public base for a local one through this build argument.
    build = SERVICES[name]["build"]
    assert build["args"]["BASE_IMAGE"] == "${FLOE_BASE_IMAGE:-python:3.11-slim}"
    text = (ROOT / build["context"] / build["dockerfile"]).read_text()
    assert "ARG BASE_IMAGE=python:3.11-slim\nFROM ${BASE_IMAGE}\n" in text, f"{name}: its Dockerfile ignores BASE_IMAGE"
