"""Workspaces: materialized privately at the base commit, prepared as the agent, diffed exactly, always removed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from sessions.settings import SessionSettings
from sessions.workspace import (
    PreparedWorkspace,
    TaskResolver,
    WorkspaceError,
    collect_diff,
    prepare_workspace,
    remove_tree,
)

from .conftest import BINARY, LocalTaskSet


async def prepared(settings: SessionSettings, taskset: LocalTaskSet, task_id: str = "demo-1") -> PreparedWorkspace:
    task = TaskResolver().resolve(str(taskset.jsonl), task_id)
    return await prepare_workspace(settings, f"x:{task_id}", task)


def scratch(ws: PreparedWorkspace, settings: SessionSettings) -> tuple[Path, Path]:
    home, run = ws.root / "home", ws.root / "run"
    home.mkdir()
    run.mkdir()
    os.chown(home, settings.agent_uid, settings.agent_gid)
    os.chmod(run, 0o755)
    return home, run


async def test_materialized_at_base_owned_by_agent_and_prepared(
    settings: SessionSettings, taskset: LocalTaskSet
) -> None:
    ws = await prepared(settings, taskset, "demo-prep")
    try:
        assert ws.base_commit == taskset.base_commit
        assert (ws.repo / "app.py").read_text().endswith("a - b\n")
        assert ws.repo.stat().st_uid == settings.agent_uid
        assert (ws.repo / ".floe" / "prepared-by").read_text().strip() == str(settings.agent_uid)
        log = subprocess.run(
            ["git", "-c", "safe.directory=*", "log", "--oneline"],
            cwd=ws.repo,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert len(log.splitlines()) == 1
        assert ws.prepare_ms > 0
    finally:
        remove_tree(ws.root)


@pytest.mark.parametrize(
    ("task_id", "match"), [("demo-badprep", "exited 3: boom"), ("demo-nobundle", "snapshot"), ("nope", "no task")]
)
async def test_bad_task_fails_and_leaves_nothing(
    settings: SessionSettings, taskset: LocalTaskSet, task_id: str, match: str
) -> None:
    with pytest.raises(WorkspaceError, match=match):
        await prepared(settings, taskset, task_id)
    assert not any((settings.work_root / "ws").iterdir()) if (settings.work_root / "ws").exists() else True


async def test_diff_is_exact_and_binary_safe(settings: SessionSettings, taskset: LocalTaskSet, tmp_path: Path) -> None:
    ws = await prepared(settings, taskset)
    home, run = scratch(ws, settings)
    try:
        (ws.repo / "app.py").write_text("def add(a, b):\n    return a + b\n")
        (ws.repo / "data.bin").write_bytes(BINARY[::-1] + b"\x00tail")
        (ws.repo / "new dir").mkdir()
        (ws.repo / "new dir" / "ünï.txt").write_text("new file\n")
        (ws.repo / "pic.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(300))
        (ws.repo / "old.txt").unlink()
        (ws.repo / ".pi").mkdir()
        (ws.repo / ".pi" / "state.json").write_text("{}")
        (ws.repo / ".floe").mkdir()
        (ws.repo / ".floe" / "ours").write_text("x")
        subprocess.run(["chown", "-R", f"{settings.agent_uid}:{settings.agent_gid}", str(ws.repo)], check=True)
        diff = await collect_diff(settings, ws, home, run, [".pi"])
    finally:
        snapshot = tmp_path / "after"
        shutil.copytree(ws.repo, snapshot, ignore=shutil.ignore_patterns(".git", ".pi", ".floe"))
        remove_tree(ws.root)
    assert ".pi/" not in diff and ".floe" not in diff
    assert "GIT binary patch" in diff
    # Applying the diff to a fresh checkout of the base reproduces the agent's tree byte for byte.
    fresh = tmp_path / "fresh"
    bundle = taskset.jsonl.parent / "repos" / "demo__repo.bundle"
    subprocess.run(["git", "clone", "-q", "--no-checkout", str(bundle), str(fresh)], check=True, capture_output=True)
    subprocess.run(["git", "checkout", "-q", taskset.base_commit], cwd=fresh, check=True, capture_output=True)
    (tmp_path / "p.diff").write_text(diff)
    subprocess.run(["git", "apply", "--binary", str(tmp_path / "p.diff")], cwd=fresh, check=True)
    shutil.rmtree(fresh / ".git")
    assert _tree(fresh) == _tree(snapshot)


async def test_prepare_artifacts_are_not_the_agents_diff(settings: SessionSettings, taskset: LocalTaskSet) -> None:
    ws = await prepared(settings, taskset, "demo-prep")
    home, run = scratch(ws, settings)
    try:
        assert (ws.repo / "build" / "out.txt").exists() and (ws.repo / "weird [name].log").exists()
        (ws.repo / "build" / "agent.txt").write_text("agent\n")  # inside an excluded dir: still environment
        (ws.repo / "mine.txt").write_text("agent\n")
        os.chown(ws.repo / "mine.txt", settings.agent_uid, settings.agent_gid)
        diff = await collect_diff(settings, ws, home, run, [])
    finally:
        remove_tree(ws.root)
    assert "mine.txt" in diff and "build/" not in diff and "weird" not in diff


async def test_unchanged_workspace_has_empty_diff(settings: SessionSettings, taskset: LocalTaskSet) -> None:
    ws = await prepared(settings, taskset)
    home, run = scratch(ws, settings)
    try:
        assert await collect_diff(settings, ws, home, run, []) == ""
    finally:
        remove_tree(ws.root)


async def test_non_utf8_text_file_still_diffs_exactly(settings: SessionSettings, taskset: LocalTaskSet) -> None:
    ws = await prepared(settings, taskset)
    home, run = scratch(ws, settings)
    try:
        (ws.repo / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
        os.chown(ws.repo / "latin1.txt", settings.agent_uid, settings.agent_gid)
        diff = await collect_diff(settings, ws, home, run, [])
    finally:
        remove_tree(ws.root)
    assert "latin1.txt" in diff and "GIT binary patch" in diff


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
