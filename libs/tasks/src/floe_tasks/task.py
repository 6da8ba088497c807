"""One task instance: the SWE-bench instance fields plus floe's own, and how to materialize its repository.

A ``Task`` is a frozen pydantic model. It accepts SWE-bench JSONL rows as they are published (FAIL_TO_PASS and
PASS_TO_PASS as JSON-encoded strings or as lists; unknown extra columns are ignored). Where the repository snapshot
lives is not part of the instance: the loading ``TaskSet`` attaches it (a git bundle), so ``materialize`` works for
bundled tasks and for any JSONL that sits next to a ``repos/`` folder of bundles.

Two evaluators exist:

- ``swebench``: the hidden ``test_patch`` is applied and the tests are run; resolved iff every FAIL_TO_PASS and
  PASS_TO_PASS test passes (graded by the scorer).
- ``answer``: a toy verifiable task. The agent writes its answer to ``answer.txt`` at the workspace root; the
  diff is graded by ``grade_answer`` (whitespace-trimmed exact match). No tests run, no sandbox is needed.

Limits: ``materialize`` needs ``git`` on PATH. The materialized tree holds only the base commit (the bundle never
contains the fix), so the agent cannot find the gold patch or the hidden tests in its history.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from floe_tasks.errors import MaterializeError

__all__ = [
    "ANSWER_FILE",
    "DEFAULT_TEST_CMD",
    "Task",
    "answer_from_diff",
    "answer_patch",
    "grade_answer",
    "patch_files",
    "score_answer",
]

DEFAULT_TEST_CMD = "python -m pytest --no-header -rA --tb=no -p no:cacheprovider"
ANSWER_FILE = "answer.txt"

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


def answer_from_diff(diff: str, filename: str = ANSWER_FILE) -> str | None:
    """The content the diff leaves in ``filename`` when it creates or rewrites it; None when it does not touch it.

    Only whole-file content is reconstructed: the added lines of the hunks for that file (a rewrite of a one-line
    answer file is a ``-old`` / ``+new`` pair, so the added lines are the new content).
    """
    lines: list[str] | None = None
    current: str | None = None
    for line in diff.splitlines():
        if line.startswith("diff --git "):
            current = None
            continue
        if line.startswith("+++ "):
            target = line[4:].strip()
            current = target[2:] if target.startswith("b/") else target
            if current == filename:
                lines = []
            continue
        if line.startswith("--- ") or line.startswith("@@"):
            continue
        if current == filename and lines is not None and line.startswith("+"):
            lines.append(line[1:])
    return None if lines is None else "\n".join(lines)


def answer_patch(answer: str, filename: str = ANSWER_FILE) -> str:
    """The diff an agent produces by writing ``answer`` to ``filename`` (the gold patch of an ``answer`` task)."""
    lines = answer.splitlines() or [""]
    body = "".join(f"+{line}\n" for line in lines)
    return (
        f"diff --git a/{filename} b/{filename}\nnew file mode 100644\n--- /dev/null\n+++ b/{filename}\n"
        f"@@ -0,0 +1,{len(lines)} @@\n{body}"
    )


def grade_answer(task: Task, diff: str) -> tuple[bool, str]:
    """Grade an ``answer`` task: (correct, reason). Whitespace around the answer is ignored, case is not."""
    if task.answer is None:
        raise ValueError(f"task {task.instance_id} has no expected answer")
    given = answer_from_diff(diff)
    if given is None:
        return False, f"the diff does not write {ANSWER_FILE}"
    if given.strip() == task.answer.strip():
        return True, "answer matches"
    return False, "answer does not match"


def score_answer(task: Task, diff: str) -> tuple[float, bool, str]:
    """Reward of an ``answer`` task: (reward, correct, reason).

    ``answer_credit="exact"``: 1 if correct, else 0. ``"digits"`` (the demo's toy tasks) adds partial credit so a tiny
    random model has a dense enough signal: a wrong answer earns 0.5 x the fraction of its characters that are digits
    (an empty answer earns 0). A correct answer always earns 1.
    """
    correct, reason = grade_answer(task, diff)
    if correct or task.answer_credit == "exact":
        return (1.0 if correct else 0.0), correct, reason
    given = (answer_from_diff(diff) or "").strip()
    if not given:
        return 0.0, False, reason
    fraction = sum(ch.isdigit() for ch in given) / len(given)
    return round(0.5 * fraction, 6), False, f"{reason}; partial credit for digits {fraction:.2f}"


def _git(args: list[str], cwd: Path | None = None) -> str:
    proc = subprocess.run(
        ["git", "-c", "advice.detachedHead=false", *args], cwd=cwd, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise MaterializeError(f"git {' '.join(args)} failed: {proc.stderr.strip()[-500:]}")
    return proc.stdout


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
    evaluator: Literal["swebench", "answer"] = "swebench"
    test_cmd: str = DEFAULT_TEST_CMD
    prepare: list[str] = Field(default_factory=list, description="shell commands run in the testbed before tests")
    answer: str | None = None
    answer_credit: Literal["exact", "digits"] = "exact"
    # SWE-bench v5 columns we carry when present (the docker backend uses ``image``)
    image: str | None = None
    log_parser: str = "parse_log_pytest"

    _snapshot: Path | None = PrivateAttr(default=None)

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _json_list(cls, value: Any) -> Any:
        # Published SWE-bench rows carry these as JSON-encoded strings.
        if isinstance(value, str):
            return json.loads(value) if value.strip() else []
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

    def materialize(self, dest: Path) -> Path:
        """Create a git working tree of the repository at ``base_commit`` in ``dest`` (absent or empty) and return it.

        The tree has no remote and no history beyond what the bundle holds (the base commit); the hidden test patch
        and the gold patch are not in it. ``answer`` tasks without a snapshot get an empty repository with one commit.
        """
        dest = Path(dest)
        if dest.exists() and any(dest.iterdir()):
            raise MaterializeError(f"{dest} exists and is not empty")
        if self._snapshot is None:
            if self.evaluator != "answer":
                raise MaterializeError(f"task {self.instance_id} has no repository snapshot (no bundle found)")
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
        except MaterializeError:
            shutil.rmtree(dest, ignore_errors=True)
            raise
        return dest
