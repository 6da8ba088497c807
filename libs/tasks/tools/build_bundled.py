"""Build floe's bundled task set from the task sources in ``tools/sources/``.

Usage (from the repository root)::

    .venv/bin/python libs/tasks/tools/build_bundled.py            # rebuild everything
    .venv/bin/python libs/tasks/tools/build_bundled.py --check    # rebuild in a temp dir, diff against the shipped set

Each source module defines ``TASK``: the buggy repository files, the fix (edits or whole files), the test files as
they are after the hidden test patch, and the issue text. For every task this script:

1. writes the buggy files into a fresh git repository and commits them (fixed author and dates, so ``base_commit``
   is reproducible): that commit is ``base_commit`` and ``environment_setup_commit``;
2. applies the fix and takes ``git diff`` as the gold ``patch``; resets; writes the tests and takes ``git diff``
   (new files via ``git add -N``) as ``test_patch``;
3. checks that the gold patch touches no test file and the test patch only test files;
4. runs the test command on base + test_patch ("pre") and on gold + test_patch ("post"), each twice, and derives
   FAIL_TO_PASS (not passing pre, passing post) and PASS_TO_PASS (passing both), dropping tests whose result
   differs between runs;
5. writes ``repos/<instance_id>.bundle`` (the base commit only: the fix never enters the bundle) and one JSONL row.

It runs the tests bare (our own trusted code) with the interpreter running this script.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SOURCES = HERE / "sources"
OUT = HERE.parent / "src" / "floe_tasks" / "bundled"
TEST_CMD = "python -m pytest --no-header -rA --tb=no -p no:cacheprovider"
GIT_ENV = {
    "GIT_AUTHOR_NAME": "floe",
    "GIT_AUTHOR_EMAIL": "tasks@floe.invalid",
    "GIT_COMMITTER_NAME": "floe",
    "GIT_COMMITTER_EMAIL": "tasks@floe.invalid",
    "GIT_CONFIG_NOSYSTEM": "1",
    "HOME": "/nonexistent",
}
_RESULT = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (\S+)")


def git(repo: Path, *args: str, date: str = "2026-01-01T00:00:00Z") -> str:
    env = {**os.environ, **GIT_ENV, "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
    proc = subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"git {args} failed: {proc.stderr}")
    return proc.stdout


def is_test_file(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return path.startswith("tests/") or name.startswith("test_") or name.endswith("_test.py")


def load_sources() -> list[dict[str, Any]]:
    tasks = []
    for path in sorted(SOURCES.glob("t*.py")):
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        tasks.append(module.TASK)
    return tasks


def write_files(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)


def apply_edits(root: Path, fix: dict[str, Any]) -> None:
    for rel, change in fix.items():
        target = root / rel
        if isinstance(change, str):
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(change)
            continue
        text = target.read_text()
        for old, new in change:
            if text.count(old) != 1:
                raise RuntimeError(f"{rel}: edit anchor occurs {text.count(old)} times: {old!r}")
            text = text.replace(old, new)
        target.write_text(text)


def diff_of_worktree(repo: Path) -> str:
    git(repo, "add", "-N", ".")
    out = git(repo, "diff", "--no-color", "--no-ext-diff", "--full-index")
    git(repo, "reset", "-q", "--hard")
    git(repo, "clean", "-fdq")
    return out


def run_tests(repo: Path, test_files: list[str]) -> dict[str, str]:
    cmd = f"{TEST_CMD} {' '.join(test_files)}".replace("python", sys.executable, 1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["PYTHONHASHSEED"] = "0"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    proc = subprocess.run(cmd, shell=True, cwd=repo, env=env, capture_output=True, text=True, timeout=120)
    status: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        m = _RESULT.match(line)
        if m:
            status[m.group(2)] = m.group(1)
    return status


def apply_patch(repo: Path, patch: str) -> None:
    proc = subprocess.run(["git", "apply", "-"], cwd=repo, input=patch, text=True, capture_output=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"patch does not apply: {proc.stderr}")


def run_side(repo: Path, patches: list[str], test_files: list[str]) -> dict[str, str]:
    for p in patches:
        apply_patch(repo, p)
    try:
        return run_tests(repo, test_files)
    finally:
        git(repo, "reset", "-q", "--hard")
        git(repo, "clean", "-fdq")


def build_one(src: dict[str, Any], work: Path, out_repos: Path) -> dict[str, Any]:
    owner, name = src["repo"].split("/")
    instance_id = f"{owner}__{name}-{src['number']}"
    repo = work / instance_id
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    write_files(repo, src["files"])
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", f"{name}: initial import", date=src["created_at"])
    base = git(repo, "rev-parse", "HEAD").strip()

    apply_edits(repo, src["fix"])
    patch = diff_of_worktree(repo)
    write_files(repo, src["tests"])
    test_patch = diff_of_worktree(repo)
    if not patch or not test_patch:
        raise RuntimeError(f"{instance_id}: empty patch or test patch")
    from_headers = re.findall(r"^diff --git a/(\S+) b/\S+$", patch, re.M)
    test_headers = re.findall(r"^diff --git a/(\S+) b/\S+$", test_patch, re.M)
    if any(is_test_file(p) for p in from_headers):
        raise RuntimeError(f"{instance_id}: gold patch touches tests: {from_headers}")
    if not all(is_test_file(p) for p in test_headers):
        raise RuntimeError(f"{instance_id}: test patch touches non-test files: {test_headers}")

    pre = [run_side(repo, [test_patch], test_headers) for _ in range(2)]
    post = [run_side(repo, [patch, test_patch], test_headers) for _ in range(2)]
    names = sorted(set().union(*pre, *post))
    stable = [t for t in names if pre[0].get(t) == pre[1].get(t) and post[0].get(t) == post[1].get(t)]
    f2p = [t for t in stable if pre[0].get(t) not in ("PASSED", "XFAIL") and post[0].get(t) == "PASSED"]
    p2p = [t for t in stable if pre[0].get(t) == "PASSED" and post[0].get(t) == "PASSED"]
    if not f2p:
        raise RuntimeError(f"{instance_id}: no FAIL_TO_PASS test (pre={pre[0]}, post={post[0]})")
    broken = [t for t, v in post[0].items() if v != "PASSED"]
    if broken:
        raise RuntimeError(f"{instance_id}: tests not passing with the gold patch: {broken}")

    git(repo, "bundle", "create", "-q", str(out_repos / f"{instance_id}.bundle"), "main")
    return {
        "instance_id": instance_id,
        "repo": src["repo"],
        "base_commit": base,
        "problem_statement": src["problem_statement"].strip() + "\n",
        "hints_text": src.get("hints_text", ""),
        "created_at": src["created_at"],
        "version": src.get("version", "0.1"),
        "environment_setup_commit": base,
        "patch": patch,
        "test_patch": test_patch,
        "FAIL_TO_PASS": f2p,
        "PASS_TO_PASS": p2p,
        "evaluator": "swebench",
        "test_cmd": TEST_CMD,
        "prepare": [],
    }


def build(out: Path) -> list[dict[str, Any]]:
    repos = out / "repos"
    if repos.exists():
        shutil.rmtree(repos)
    repos.mkdir(parents=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="floe-build-") as tmp:
        for src in load_sources():
            row = build_one(src, Path(tmp), repos)
            print(f"{row['instance_id']}: F2P={len(row['FAIL_TO_PASS'])} P2P={len(row['PASS_TO_PASS'])}", flush=True)
            rows.append(row)
    rows.sort(key=lambda r: r["instance_id"])
    with (out / "tasks.jsonl").open("w") as fh:
        for row in rows:
            fh.write(json.dumps(row, sort_keys=True) + "\n")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="build into a temp dir and compare with the shipped set")
    args = parser.parse_args(argv)
    if not args.check:
        rows = build(OUT)
        print(f"wrote {len(rows)} tasks to {OUT}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        build(Path(tmp))
        same = (Path(tmp) / "tasks.jsonl").read_text() == (OUT / "tasks.jsonl").read_text()
    print("bundled task set is up to date" if same else "bundled task set is STALE: rerun build_bundled.py")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
