"""Diffs are bytes: a valid diff of a file that is not UTF-8 is graded as written, not "repaired" on the way.

The repository here holds a Latin-1 file; the fix changes one of its lines, and the hidden test checks the file's
exact bytes. The diff file handed to ``floe score`` is therefore not UTF-8. Reading it with ``errors="replace"``
(the old behaviour) turned each Latin-1 byte into U+FFFD, so the patch no longer matched the file and did not apply.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from scorer.cli import main

LATIN1_BEFORE = "caf\xe9\nna\xefve\n".encode("latin-1")
LATIN1_AFTER = "caf\xe9s\nna\xefve\n".encode("latin-1")
TEST_FILE = """\
from pathlib import Path


def test_plural():
    assert Path("words.txt").read_bytes() == {after!r}


def test_second_line_kept():
    assert Path("words.txt").read_bytes().splitlines()[1] == {second!r}
"""


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True, capture_output=True
    ).stdout.decode("utf-8", errors="surrogateescape")


def _task_set(root: Path) -> tuple[Path, bytes]:
    repo = root / "src"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    (repo / "words.txt").write_bytes(LATIN1_BEFORE)
    (repo / "tests").mkdir()
    (repo / "tests" / "__init__.py").write_text("")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "base")
    base = _git(repo, "rev-parse", "HEAD").strip()
    (repo / "tests" / "test_words.py").write_text(
        TEST_FILE.format(after=LATIN1_AFTER, second=LATIN1_AFTER.splitlines()[1])
    )
    _git(repo, "add", "-A")
    test_patch = _git(repo, "diff", "--cached", base)
    _git(repo, "reset", "-q", "--hard", base)
    (repo / "words.txt").write_bytes(LATIN1_AFTER)
    fix = subprocess.run(["git", "diff"], cwd=repo, check=True, capture_output=True).stdout
    _git(repo, "checkout", "-q", "--", ".")
    (root / "repos").mkdir()
    _git(repo, "bundle", "create", str(root / "repos" / "me__words-1.bundle"), "--all")
    instance = {
        "instance_id": "me__words-1",
        "repo": "me/words",
        "base_commit": base,
        "problem_statement": "Pluralise the first word.",
        # The gold patch rides in JSON, so it is a str; the diff under test below is the raw bytes.
        "patch": fix.decode("latin-1"),
        "test_patch": test_patch,
        "FAIL_TO_PASS": json.dumps(["tests/test_words.py::test_plural"]),
        "PASS_TO_PASS": json.dumps(["tests/test_words.py::test_second_line_kept"]),
    }
    (root / "tasks.jsonl").write_text(json.dumps(instance) + "\n")
    return root / "tasks.jsonl", fix


def test_a_diff_of_a_latin1_file_is_applied_byte_for_byte(
    scorer_work: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLOE_SCORER_WORK_DIR", str(scorer_work))
    tasks, fix = _task_set(tmp_path)
    with pytest.raises(UnicodeDecodeError):
        fix.decode("utf-8")  # the point of the test: this diff is not UTF-8
    diff = tmp_path / "fix.diff"
    diff.write_bytes(fix)
    code = main(["--task", "me__words-1", "--diff", str(diff), "--task-source", str(tasks), "--json"])
    out = capsys.readouterr().out
    # The report is printed with indent=2, so it starts at a line of its own that is just "{";
    # log lines may come before it on stdout or go to stderr, depending on how logging was set up.
    lines = out.splitlines()
    report = json.loads("\n".join(lines[lines.index("{") :]))
    assert code == 0, report
    assert report["outcome"] == "resolved"
    assert report["tests"] == {
        "tests/test_words.py::test_plural": "PASSED",
        "tests/test_words.py::test_second_line_kept": "PASSED",
    }
