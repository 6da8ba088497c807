"""One task instance: the SWE-bench instance fields plus floe's own, and how to materialize its repository.

A ``Task`` is a frozen pydantic model. It accepts SWE-bench rows as they are published (FAIL_TO_PASS and
PASS_TO_PASS as JSON-encoded strings or as lists; a string that is not a JSON list of strings is an error; a numeric
``version`` is kept as its text and a timestamp ``created_at`` as ISO text; unknown extra columns are ignored). Where
the repository snapshot lives is not part of the instance: the loading ``TaskSet`` attaches it (a git bundle), so
``materialize`` works for bundled tasks and for any JSONL or Parquet file that sits next to a ``repos/`` folder of
bundles.

``evaluator`` names the scorer evaluator that grades the task (``swebench`` by default; the demo's toy tasks use
``answer``). This library only carries the name and the fields evaluators read (``answer``, ``answer_credit``,
``test_cmd``, ``prepare``, ...): what they mean, and which are required, is the evaluator's (``scorer.evaluators``,
checked by ``floe score validate``).

Limits: ``materialize`` needs ``git`` on PATH. The materialized tree names only the base commit (a detached HEAD; no
branch, tag or reflog entry), so ``git log --all`` shows no commit past it. Objects the bundle holds beyond the base
stay in the tree's pack, unnamed: a bundle must not contain the fix (floe's bundles hold the base commit only).
"""

from __future__ import annotations

import datetime
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from floe_tasks.errors import MaterializeError

__all__ = ["DEFAULT_TEST_CMD", "Task", "patch_files"]

DEFAULT_TEST_CMD = "python -m pytest --no-header -rA --tb=no -p no:cacheprovider"

_DIFF_HEADER = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)
_PLUS_HEADER = re.compile(r"^\+\+\+ b/(\S+)$", re.MULTILINE)
_MINUS_HEADER = re.compile(r"^--- a/(\S+)$", re.MULTILINE)


def patch_files(diff: str) -> list[str]:
    """Paths a unified diff touches (both sides of renames), in order of first appearance."""
    seen: dict[str, None] = {}
    for a, b in _DIFF_HEADER.findall(diff):
        seen.setdefault(a, None)
        seen.setdefault(b, None)
    if not seen:  # plain unified diff without git headers
        for path in _MINUS_HEADER.findall(diff) + _PLUS_HEADER.findall(diff):
            seen.setdefault(path, None)
    return [p for p in seen if p != "/dev/null"]


def _git(args: list[str], cwd: Path | None = None) -> str:
    proc = subprocess.run(
        ["git", "-c", "advice.detachedHead=false", *args], cwd=cwd, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise MaterializeError(f"git {' '.join(args)} failed: {proc.stderr.strip()[-500:]}")
    return proc.stdout


def _forget_other_commits(tree: Path) -> None:
    """Leave HEAD (detached at the base commit) as the only way to name a commit. A bundle made with ``--all`` from a
    repository that also holds the fix would otherwise show it to the agent: clone makes a local branch of the
    bundle's HEAD, tags point past the base, and the reflog records the branch tip. Their objects stay in the pack
    (``git fsck --unreachable`` can still find them), which is why a snapshot should hold only the base's history."""
    refs = _git(["for-each-ref", "--format=%(refname)"], cwd=tree).split()
    if refs:
        proc = subprocess.run(
            ["git", "update-ref", "--stdin"],
            cwd=tree,
            input="".join(f"delete {ref}\n" for ref in refs),
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise MaterializeError(f"git update-ref failed: {proc.stderr.strip()[-500:]}")
    _git(["reflog", "expire", "--expire=now", "--all"], cwd=tree)


class Task(BaseModel):
    """One SWE-bench-format instance (+ floe fields). Producer: task-set authors. Consumers: scorer, session runner."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    instance_id: str
    repo: str = ""
    base_commit: str = ""
    problem_statement: str
    patch: str = ""
    test_patch: str = ""
    FAIL_TO_PASS: list[str] = Field(default_factory=list)
    PASS_TO_PASS: list[str] = Field(default_factory=list)
    version: str = ""
    created_at: str = ""
    environment_setup_commit: str = ""
    hints_text: str = ""
    # floe fields
    evaluator: str = Field(default="swebench", description="the scorer evaluator that grades this task, by name")
    test_cmd: str = DEFAULT_TEST_CMD
    prepare: list[str] = Field(default_factory=list, description="shell commands run in the testbed before tests")
    answer: str | None = None
    # exact: the whole answer; first_number: the first integer in it (still 1 or 0); digits: partial credit (toy)
    answer_credit: Literal["exact", "first_number", "digits"] = "exact"
    # SWE-bench v5 columns we carry when present (the docker backend uses ``image``)
    image: str | None = None
    log_parser: str = "parse_log_pytest"

    _snapshot: Path | None = PrivateAttr(default=None)

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _json_list(cls, value: Any) -> Any:
        # Published SWE-bench rows (the hub's JSONL and Parquet) carry these as JSON-encoded strings. Anything but a
        # JSON list of strings is refused (pydantic names the field, ``TaskSet`` the file, row and instance): a test
        # list that parsed as something else would grade every session against the wrong tests.
        if not isinstance(value, str):
            return value
        if not value.strip():
            return []
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"a string that is not JSON ({exc.msg}): {value[:80]!r}") from None
        if not isinstance(parsed, list) or not all(isinstance(t, str) for t in parsed):
            raise ValueError(f"must be a list of test ids or a JSON list of strings, got {value[:80]!r}")
        return parsed

    @field_validator("version", mode="before")
    @classmethod
    def _version_text(cls, value: Any) -> Any:
        # Exports that went through pandas turn "3.0" into the number 3.0; the version is a label, so keep its text.
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
        return value

    @field_validator("created_at", mode="before")
    @classmethod
    def _timestamp_text(cls, value: Any) -> Any:
        # A Parquet timestamp column reads as a datetime; the field is the ISO text SWE-bench publishes.
        if isinstance(value, datetime.date):
            return value.isoformat()
        return value

    @property
    def test_files(self) -> list[str]:
        """Files the hidden test patch touches (reset to base before it is applied)."""
        return patch_files(self.test_patch)

    @property
    def snapshot(self) -> Path | None:
        """The git bundle holding ``base_commit``, when the loading task set knows one."""
        return self._snapshot

    def with_snapshot(self, bundle: Path | None) -> Task:
        """A copy of this task that materializes from ``bundle``."""
        clone = self.model_copy()
        clone._snapshot = bundle
        return clone

    def require_snapshot(self) -> None:
        """Raise ``MaterializeError`` when this task names a base commit and no snapshot holds it."""
        if self._snapshot is None and self.base_commit:
            raise MaterializeError(
                f"task {self.instance_id} has no repository snapshot: no git bundle holding {self.base_commit[:12]}"
                f" was found (repos/{self.instance_id}.bundle or repos/{self.repo.replace('/', '__')}.bundle"
                " next to the task file)"
            )

    def materialize(self, dest: Path) -> Path:
        """Create a git working tree of the repository at ``base_commit`` in ``dest`` (absent or empty) and return it.

        The tree has no remote, no branch, tag or reflog: only its detached HEAD, the base commit, names a commit
        (even when the bundle was made with ``--all`` from a repository holding later commits). The hidden test patch
        and the gold patch are not in it. A task without a snapshot that names no ``base_commit`` (a task that needs
        no repository, such as an ``answer`` task) gets an empty repository with one commit.
        """
        dest = Path(dest)
        if dest.exists() and any(dest.iterdir()):
            raise MaterializeError(f"{dest} exists and is not empty")
        if self._snapshot is None:
            self.require_snapshot()
            dest.mkdir(parents=True, exist_ok=True)
            _git(["init", "-q", "-b", "main", str(dest)])
            _git(
                [
                    "-c",
                    "user.name=floe",
                    "-c",
                    "user.email=floe@localhost",
                    "commit",
                    "-q",
                    "--allow-empty",
                    "-m",
                    "task",
                ],
                cwd=dest,
            )
            return dest
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists():
            dest.rmdir()
        try:
            _git(["clone", "-q", "--no-checkout", str(self._snapshot), str(dest)])
            _git(["checkout", "-q", "--detach", self.base_commit], cwd=dest)
            _git(["remote", "remove", "origin"], cwd=dest)
            _forget_other_commits(dest)
        except MaterializeError:
            shutil.rmtree(dest, ignore_errors=True)
            raise
        return dest
