"""Per-instance images for the docker backend, built the way SWE-bench builds its own (docs/scorer.md, "Docker").

SWE-bench grades each instance in ``sweb.eval.x86_64.<instance>``: an *environment* image (the interpreter and the
test dependencies) with the repository at ``base_commit`` in ``/testbed`` on top. Official images come from a
registry; machines that cannot pull (and users with their own repositories) build the same two layers here:

- ``<ns>/sweb.env.x86_64.<hash>``: ``FROM`` a base with Python (``deploy/docker/base-image.sh`` makes
  ``floe/base:local`` without a registry), ``git`` and ``patch`` from the base's Debian mirror, and the scorer's own
  copied pytest (``scorer.testenv``) on ``PYTHONPATH``: the same test code the bubblewrap backend runs, so verdicts
  can be compared backend against backend;
- ``<ns>/sweb.eval.x86_64.<instance>``: ``FROM`` the environment, ``COPY`` of ``Task.materialize`` (the bundle at
  ``base_commit``, with its ``.git``) to ``/testbed``.

Both carry a ``floe.image.hash`` label over what went into them; a build whose label matches is skipped, so
``build_images`` is cheap to call again.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path

import structlog

from floe_tasks import Task
from scorer.errors import ScorerError
from scorer.testenv import TestEnv

__all__ = ["DEFAULT_BASE", "ImageBuildError", "build_env_image", "build_images", "build_instance_image", "image_name"]

log = structlog.get_logger()

DEFAULT_BASE = "floe/base:local"
TESTENV_DIR = "/opt/floe/testenv/site"
HASH_LABEL = "floe.image.hash"


class ImageBuildError(ScorerError):
    """An image could not be built: the docker engine's own words are in the message."""


def image_name(namespace: str, instance_id: str) -> str:
    """SWE-bench's naming: ``<ns>/sweb.eval.x86_64.<id with '__' as '_1776_'>:latest``, lower case."""
    return f"{namespace}/sweb.eval.x86_64.{instance_id.replace('__', '_1776_')}:latest".lower()


def _docker(docker: str, args: list[str], *, timeout: float = 600.0) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run([docker, *args], capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError as exc:
        raise ImageBuildError(f"docker binary {docker!r} not found") from exc
    except subprocess.TimeoutExpired as exc:
        raise ImageBuildError(f"docker {args[0]} did not finish in {timeout:.0f}s") from exc


def _label(docker: str, image: str) -> str | None:
    res = _docker(docker, ["image", "inspect", "--format", f'{{{{ index .Config.Labels "{HASH_LABEL}" }}}}', image])
    return res.stdout.strip() if res.returncode == 0 else None


def _build(docker: str, image: str, context: Path, digest: str) -> str:
    if _label(docker, image) == digest:
        return image
    # The legacy builder needs no buildx plugin (nothing is pulled: FROM names local images only).
    res = _docker(docker, ["build", "-q", "--label", f"{HASH_LABEL}={digest}", "-t", image, str(context)])
    if res.returncode != 0:
        tail = "\n".join((res.stderr or res.stdout).strip().splitlines()[-15:])
        raise ImageBuildError(f"building {image} failed:\n{tail}")
    log.info("image built", image=image)
    return image


def _tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.is_file():
            h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def build_env_image(
    testenv: TestEnv, *, namespace: str = "floe", base: str = DEFAULT_BASE, docker: str = "docker"
) -> str:
    """The environment image: base + git/patch + the scorer's pytest. Returns its name."""
    dockerfile = (
        f"FROM {base}\n"
        "RUN apt-get update -q && apt-get install -y -q --no-install-recommends git patch"
        " && rm -rf /var/lib/apt/lists/*\n"
        f"COPY site {TESTENV_DIR}\n"
        f"ENV PYTHONPATH={TESTENV_DIR} PYTHONDONTWRITEBYTECODE=1\n"
    )
    digest = hashlib.sha256((dockerfile + _tree_digest(testenv.site)).encode()).hexdigest()
    image = f"{namespace}/sweb.env.x86_64.{digest[:16]}:latest"
    if _label(docker, image) == digest:
        return image
    with tempfile.TemporaryDirectory(prefix="floe-env-image-") as tmp:
        ctx = Path(tmp)
        (ctx / "Dockerfile").write_text(dockerfile)
        shutil.copytree(testenv.site, ctx / "site")
        return _build(docker, image, ctx, digest)


def build_instance_image(task: Task, env_image: str, *, namespace: str = "floe", docker: str = "docker") -> str:
    """The instance image: the environment + the repository at ``base_commit`` in ``/testbed``."""
    task.require_snapshot()
    h = hashlib.sha256(env_image.encode())
    h.update(json.dumps(task.model_dump(mode="json"), sort_keys=True).encode())
    if task.snapshot is not None:
        h.update(hashlib.sha256(task.snapshot.read_bytes()).digest())
    digest = h.hexdigest()
    image = image_name(namespace, task.instance_id)
    if _label(docker, image) == digest:
        return image
    with tempfile.TemporaryDirectory(prefix="floe-instance-image-") as tmp:
        ctx = Path(tmp)
        task.materialize(ctx / "testbed")
        (ctx / "Dockerfile").write_text(f"FROM {env_image}\nCOPY testbed /testbed\nWORKDIR /testbed\n")
        # Without a .dockerignore the whole testbed (its .git included) is the context: the eval script needs git.
        return _build(docker, image, ctx, digest)


def build_images(
    tasks: Iterable[Task],
    testenv: TestEnv,
    *,
    namespace: str = "floe",
    base: str = DEFAULT_BASE,
    docker: str = "docker",
) -> dict[str, str]:
    """Build (or find up to date) the environment image and one instance image per task: ``{instance_id: image}``."""
    env_image = build_env_image(testenv, namespace=namespace, base=base, docker=docker)
    return {t.instance_id: build_instance_image(t, env_image, namespace=namespace, docker=docker) for t in tasks}
