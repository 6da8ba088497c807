"""Task workspaces: resolve a task, materialize it privately, run its prepare steps, and collect the final diff.

A workspace is a directory ``<work_root>/ws/<id>/repo`` holding a git working tree at the task's base commit
(``floe_tasks.Task.materialize``: no history past the base, no hidden tests, no gold patch), owned by the sandbox
uid. Prepare steps (``task.prepare``) run inside the sandbox as that uid, optionally with network for package
registries. Diff collection also runs inside the sandbox as the agent uid, because the agent controls ``.git``
(hooks, filter drivers, fsmonitor): nothing from the workspace ever executes as the node's user.

Diff = everything that differs from the base commit, SWE-bench style: ``git add -A`` then
``git diff --cached --binary <base>``, with the harness's state folders and our own ``.floe/`` excluded by pathspec.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from floe_tasks import Task, TaskError, TaskSet
from sandbox import RUN_MOUNT, Keep, SandboxError, SandboxSpec, run
from sessions.launch import session_spec
from sessions.settings import SessionSettings

__all__ = [
    "OUR_FILES",
    "PreparedWorkspace",
    "TaskResolver",
    "WorkspaceError",
    "collect_diff",
    "prepare_workspace",
    "remove_tree",
]

OUR_FILES = (".floe",)
T = TypeVar("T")


class WorkspaceError(RuntimeError):
    """A task could not be resolved, materialized or prepared, or its diff could not be collected."""


class TaskResolver:
    """``SessionRequested.task_source`` -> ``TaskSet``: ``bundled`` or a path to a SWE-bench JSONL (its bundles in
    ``repos/`` next to it). Loaded sets are cached; they are immutable."""

    def __init__(self) -> None:
        self._sets: dict[str, TaskSet] = {}

    def resolve(self, task_source: str, task_id: str) -> Task:
        try:
            taskset = self._sets.get(task_source)
            if taskset is None:
                taskset = TaskSet.from_source(task_source)
                self._sets[task_source] = taskset
            return taskset.get(task_id)
        except TaskError as exc:
            raise WorkspaceError(f"task {task_source}:{task_id}: {exc}") from exc


@dataclass
class PreparedWorkspace:
    """A materialized, prepared workspace waiting for (or used by) one session."""

    key: str  # "<task_source>:<task_id>"
    root: Path  # <work_root>/ws/<id>; removed as a whole
    repo: Path  # root/repo, the agent's workspace
    base_commit: str
    prepare_ms: float
    prepared_at: float = field(default_factory=time.monotonic)


async def _in_thread(fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn`` in a thread and, if we are cancelled meanwhile, still wait for it: a thread cannot be stopped,
    and removing a directory that ``git clone`` is still writing into would race."""
    job = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        return await asyncio.shield(job)
    except asyncio.CancelledError:
        with contextlib.suppress(BaseException):
            await job
        raise


def _chown_tree(path: Path, uid: int, gid: int) -> None:
    os.chown(path, uid, gid)
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), uid, gid, follow_symlinks=False)


def _git_head(repo: Path) -> str:
    # The tree was just made by floe_tasks (trusted); nothing from the agent has touched it yet.
    proc = subprocess.run(
        ["git", "-c", f"safe.directory={repo}", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise WorkspaceError(f"materialized tree has no HEAD: {proc.stderr.strip()}")
    return proc.stdout.strip()


async def prepare_workspace(settings: SessionSettings, key: str, task: Task) -> PreparedWorkspace:
    """Materialize ``task`` into a fresh private workspace and run its prepare steps. Raises ``WorkspaceError``;
    a failure leaves nothing behind."""
    started = time.monotonic()
    root = settings.work_root / "ws" / secrets.token_hex(8)
    repo = root / "repo"
    try:
        root.mkdir(parents=True)
        os.chmod(root, 0o711)
        try:
            await _in_thread(task.materialize, repo)
        except TaskError as exc:
            raise WorkspaceError(f"materialize {key}: {exc}") from exc
        base = await _in_thread(_git_head, repo)
        await _in_thread(_chown_tree, repo, settings.agent_uid, settings.agent_gid)
        if task.prepare:
            await _run_prepare(settings, root, repo, task.prepare)
    except BaseException:
        await asyncio.to_thread(remove_tree, root)
        raise
    return PreparedWorkspace(
        key=key, root=root, repo=repo, base_commit=base, prepare_ms=(time.monotonic() - started) * 1000.0
    )


def _scratch(root: Path, settings: SessionSettings, name: str) -> tuple[Path, Path]:
    home, run = root / f"{name}-home", root / f"{name}-run"
    for d in (home, run):
        d.mkdir(exist_ok=True)
    os.chown(home, settings.agent_uid, settings.agent_gid)
    os.chmod(home, 0o700)
    os.chmod(run, 0o755)
    return home, run


async def _run_prepare(settings: SessionSettings, root: Path, repo: Path, steps: list[str]) -> None:
    home, run = _scratch(root, settings, "prepare")
    try:
        for i, step in enumerate(steps):
            spec = session_spec(
                settings,
                ["/bin/sh", "-c", step],
                workspace=repo,
                home=home,
                run_dir=run,
                network="host" if settings.prepare_network else "none",
            )
            try:
                code, _, err = await _collect(
                    spec, timeout=settings.prepare_step_timeout_s, max_stdout=16 * 1024 * 1024
                )
            except SandboxError as exc:
                raise WorkspaceError(f"prepare step {i + 1} ({step[:80]!r}): {exc}") from exc
            if code != 0:
                raise WorkspaceError(f"prepare step {i + 1} ({step[:80]!r}) exited {code}: {err[-500:]}")
        # Files the prepare steps created (build dirs, egg-info, caches) are environment, not the agent's work:
        # list them in .git/info/exclude so the final diff holds only what the agent changed. (Tracked files a
        # prepare step modifies do show up; task authors keep the tracked tree clean.)
        list_new = ["git", "ls-files", "--others", "--exclude-standard", "--directory", "-z"]
        spec = session_spec(settings, list_new, workspace=repo, home=home, run_dir=run)
        code, out, err = await _collect(spec, timeout=120.0, max_stdout=16 * 1024 * 1024)
        if code != 0:
            raise WorkspaceError(f"listing prepare artifacts failed: {err[-500:]}")
        created = [p for p in out.decode("utf-8", "surrogateescape").split("\0") if p and not p.startswith(".floe/")]
        if created:
            exclude = repo / ".git" / "info" / "exclude"
            exclude.parent.mkdir(exist_ok=True)
            with exclude.open("a", encoding="utf-8", errors="surrogateescape") as f:
                f.write("# created by floe prepare steps\n")
                f.writelines("/" + _glob_escape(p) + "\n" for p in created)
    finally:
        await asyncio.to_thread(remove_tree, home)
        await asyncio.to_thread(remove_tree, run)


def _glob_escape(path: str) -> str:
    return "".join("\\" + c if c in "*?[]!#\\ " else c for c in path)


async def collect_diff(
    settings: SessionSettings, workspace: PreparedWorkspace, home: Path, run_dir: Path, exclude: list[str]
) -> str:
    """The binary-safe diff of the workspace against its base commit, without ``exclude`` and our own files."""
    pathspec = [".", *(f":(exclude,top){p}" for p in [*exclude, *OUR_FILES])]
    try:
        return (await _git_diff(settings, workspace, home, run_dir, pathspec, [])).decode("utf-8")
    except UnicodeDecodeError:
        pass
    # A text file that is not UTF-8 would put raw bytes into the patch; SessionFinished carries a str, so treat
    # every file as binary (base85 hunks, still exact) for this diff.
    attrs = run_dir / "all-binary.attributes"
    attrs.write_text("* binary\n")
    os.chmod(attrs, 0o644)
    forced = ["-c", f"core.attributesFile={RUN_MOUNT}/{attrs.name}"]
    out = await _git_diff(settings, workspace, home, run_dir, pathspec, forced)
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError as exc:  # a checked-in .gitattributes can override ours
        raise WorkspaceError("diff is not valid UTF-8 even with every file treated as binary") from exc


async def _git_diff(
    settings: SessionSettings,
    workspace: PreparedWorkspace,
    home: Path,
    run_dir: Path,
    pathspec: list[str],
    extra: list[str],
) -> bytes:
    # No hooks, no fsmonitor, no external diff or textconv: the output is the tree's content, nothing else.
    git = ["git", "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", "-c", "core.quotepath=false", *extra]
    steps = [
        [*git, "add", "-A", "--", *pathspec],
        [
            *git,
            "diff",
            "--cached",
            "--binary",
            "--no-ext-diff",
            "--no-textconv",
            "--no-color",
            "--no-renames",
            workspace.base_commit,
            "--",
            *pathspec,
        ],
    ]
    out = b""
    for argv in steps:
        spec = session_spec(settings, argv, workspace=workspace.repo, home=home, run_dir=run_dir)
        try:
            code, out, err = await _collect(spec, timeout=120.0, max_stdout=settings.max_diff_bytes)
        except SandboxError as exc:
            raise WorkspaceError(f"diff collection: {exc}") from exc
        if code != 0:
            raise WorkspaceError(f"git {argv[len(git)]} exited {code}: {err[-500:]}")
    return out


async def _collect(spec: SandboxSpec, *, timeout: float, max_stdout: int) -> tuple[int, bytes, str]:
    """Run a short command in the sandbox: (exit code, all of stdout, stderr tail). ``SandboxError`` when stdout
    exceeds ``max_stdout`` or on timeout."""
    res = await run(replace(spec, stdout=Keep(head=max_stdout, tail=0)), timeout=timeout)
    if res.timed_out:
        raise SandboxError(f"{spec.argv[0]} timed out after {timeout:.0f}s")
    if res.stdout_overflowed:
        raise SandboxError(f"output of {spec.argv[0]} exceeds {max_stdout} bytes")
    if res.exit_code is None:
        raise SandboxError(f"{spec.argv[0]} did not exit after its kill")
    return res.exit_code, res.stdout, res.stderr_text


def remove_tree(path: Path) -> None:
    """Remove a workspace or session directory. The node runs as root, so modes the agent set inside do not stop
    it; a file that vanished meanwhile is fine."""
    shutil.rmtree(path, ignore_errors=True)
    if path.exists():
        raise WorkspaceError(f"could not remove {path}")
