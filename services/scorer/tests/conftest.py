"""Shared fixtures for scorer tests: a real bwrap grader with short limits, and a diff builder."""

from __future__ import annotations

import random
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from floe_tasks import Task, TaskSet
from scorer.factory import make_grader
from scorer.grader import Grader
from scorer.settings import ScorerSettings


@pytest.fixture(scope="session")
def bundled() -> TaskSet:
    return TaskSet.bundled()


@pytest.fixture(scope="session")
def scorer_work(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    # under /var/tmp: the sandbox uid must traverse it (pytest's tmp is under a 0700 dir)
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="floe-scorer-test-", dir="/var/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def settings(scorer_work: Path) -> ScorerSettings:
    return ScorerSettings(
        work_dir=scorer_work,
        workers=2,
        # Wall clock per instance: room for a loaded 2-core CI machine (a bundled gold run once took over 6 s
        # there); busy loops still stop at cpu_s.
        timeout_s=20.0,
        cpu_s=4,
        memory_bytes=1024**3,
        nproc=64,
        fsize_bytes=8 * 1024**2,
        testbed_bytes=32 * 1024**2,
        max_diff_bytes=1024 * 1024,
        # a uid block of our own: concurrent test sessions must not share RLIMIT_NPROC or see each other's jobs
        first_uid=random.randrange(200_000, 2_000_000, 16),
    )


@pytest.fixture(scope="session")
def grader(settings: ScorerSettings) -> Grader:
    grader, probe = make_grader(settings)
    assert probe.level == "A", probe.detail
    return grader


@pytest.fixture
def make_diff(tmp_path: Path) -> Callable[[Task, dict[str, str | None]], str]:
    """A real ``git diff`` of the task's base tree after writing (or, with None, deleting) files."""

    def make(task: Task, edits: dict[str, str | None]) -> str:
        tree = task.materialize(tmp_path / f"tree-{len(list(tmp_path.iterdir()))}")
        for rel, text in edits.items():
            target = tree / rel
            if text is None:
                target.unlink()
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text)
        subprocess.run(["git", "add", "-N", "."], cwd=tree, check=True)
        return subprocess.run(["git", "diff", "HEAD"], cwd=tree, check=True, capture_output=True, text=True).stdout

    return make
