"""The scorer's docker backend for real: per-instance images built here, the same verdicts as bubblewrap.

Images are built the way SWE-bench's are (``scorer.images``: an environment image from the local base of
deploy/docker/base-image.sh, then one image per instance with the repository at ``base_commit`` in ``/testbed``).
Every bundled task's validation checks (gold, empty, test patch alone) are graded by both backends; outcomes and
per-test statuses must agree. Then what only a container backend can get wrong: a job past its wall-clock limit is
killed with its container (none is left), and a task whose image is missing is an ``error`` that says how to build
it, never a reward of 0.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from contracts import Outcome
from floe_tasks import Task, TaskSet
from scorer.evaluators import get_evaluator
from scorer.factory import make_grader
from scorer.grader import Grader
from scorer.images import build_images
from scorer.settings import ScorerSettings
from scorer.testenv import build_testenv

pytestmark = [pytest.mark.slow, pytest.mark.docker]

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "floe"


def _grading_containers() -> list[str]:
    out = subprocess.run(
        ["docker", "ps", "-aq", "--filter", "label=floe.grading"], capture_output=True, text=True, check=True
    )
    return out.stdout.split()


@pytest.fixture(scope="module")
def images(docker_engine: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    base = subprocess.run(
        ["bash", str(ROOT / "deploy" / "docker" / "base-image.sh")],
        env=docker_engine,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert base.returncode == 0, base.stderr[-2000:]
    testenv = build_testenv(tmp_path_factory.mktemp("testenv"))
    tasks = [t for t in TaskSet.bundled() if t.base_commit]
    return build_images(tasks, testenv, namespace=NAMESPACE, base=base.stdout.strip())


@pytest.fixture
def work() -> Iterator[Path]:
    # Not under pytest's tmp_path (mode 0700): the bubblewrap backend's unprivileged uid must reach its test env.
    path = Path(tempfile.mkdtemp(prefix="floe-docker-grading-", dir="/var/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _grader(work: Path, **overrides: object) -> Grader:
    grader, _ = make_grader(ScorerSettings(work_dir=work, **overrides))  # type: ignore[arg-type]
    return grader


def _grade_checks(grader: Grader, task: Task) -> dict[str, tuple[str, dict[str, str]]]:
    checks = get_evaluator(task.evaluator).checks(task)
    out = {}
    for name, diff in checks.items():
        res = grader.grade(task, diff, run_empty=True)
        out[name] = (res.outcome.value, res.tests)
    return out


def _prefixed(task: Task, tmp: Path, code: str) -> str:
    """A real diff (so it applies) that puts ``code`` at the top of the module the gold patch fixes."""
    module = next(line[len("+++ b/") :] for line in task.patch.splitlines() if line.startswith("+++ b/"))
    tree = task.materialize(tmp / "tree")
    target = tree / module
    target.write_text(code + target.read_text())
    return subprocess.run(["git", "diff"], cwd=tree, capture_output=True, text=True, check=True).stdout


def test_docker_backend_gives_the_bubblewrap_verdicts_on_the_bundled_set(images: dict[str, str], work: Path) -> None:
    tasks = [t for t in TaskSet.bundled() if t.instance_id in images]
    assert len(tasks) >= 20
    docker = _grader(work / "docker", backend="docker", docker_namespace=NAMESPACE)
    bwrap = _grader(work / "bwrap")
    assert docker.sandbox.isolation == "docker" and bwrap.sandbox.isolation == "A"
    with ThreadPoolExecutor(max_workers=2) as pool:
        ids = [t.instance_id for t in tasks]
        in_docker = dict(zip(ids, pool.map(lambda t: _grade_checks(docker, t), tasks), strict=True))
        in_bwrap = dict(zip(ids, pool.map(lambda t: _grade_checks(bwrap, t), tasks), strict=True))
    for iid, checks in in_docker.items():
        assert checks["gold"][0] == Outcome.RESOLVED.value, (iid, checks["gold"])
        assert checks["empty"][0] == Outcome.UNRESOLVED.value, (iid, checks["empty"])
    assert in_docker == in_bwrap
    assert _grading_containers() == []


def test_a_job_past_its_wall_clock_limit_is_killed_with_its_container(images: dict[str, str], tmp_path: Path) -> None:
    task = TaskSet.bundled().get("floe__calx-7")
    grader = _grader(tmp_path / "work", backend="docker", docker_namespace=NAMESPACE, timeout_s=6.0)
    # A module the tests import sleeps at import: the run outlives the limit.
    res = grader.grade(task, _prefixed(task, tmp_path, "import time\ntime.sleep(600)\n"))
    assert res.outcome is Outcome.UNRESOLVED, res.reason
    assert res.timings_ms["total"] < 30_000
    assert _grading_containers() == []


def test_a_memory_bomb_is_killed_by_the_containers_memory_limit_and_named(
    images: dict[str, str], tmp_path: Path
) -> None:
    task = TaskSet.bundled().get("floe__calx-7")
    limit = 96 * 1024**2
    grader = _grader(tmp_path / "work", backend="docker", docker_namespace=NAMESPACE, address_space_bytes=limit)
    res = grader.grade(task, _prefixed(task, tmp_path, "hog = [bytearray(1 << 20) for _ in range(1024)]\n"))
    assert res.outcome is Outcome.UNRESOLVED, res.reason
    assert "memory limit (docker --memory, 96.0 MiB)" in res.reason
    assert _grading_containers() == []


def test_a_missing_image_is_an_error_that_says_how_to_build_it(images: dict[str, str], tmp_path: Path) -> None:
    task = TaskSet.bundled().get("floe__calx-7")
    grader = _grader(tmp_path, backend="docker", docker_namespace="floe-no-such-namespace")
    res = grader.grade(task, task.patch)
    assert res.outcome is Outcome.ERROR
    assert "floe score images" in res.reason
