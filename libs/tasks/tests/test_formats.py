"""SWE-bench's own dataset files load as they are: the hub's JSONL (test lists as JSON-encoded strings) and its
Parquet export (one row per instance, every column a string), to the same tasks as floe's bundled-style JSONL."""

from __future__ import annotations

import datetime
import json
import subprocess
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from floe_tasks import BUNDLED_DIR, TaskSet, TaskSetError

# The columns SWE-bench publishes (princeton-nlp/SWE-bench and its Lite / Verified subsets), all strings on the hub.
HUB_COLUMNS = [
    "repo",
    "instance_id",
    "base_commit",
    "patch",
    "test_patch",
    "problem_statement",
    "hints_text",
    "created_at",
    "version",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
    "environment_setup_commit",
]
HUB_SCHEMA = pa.schema([(c, pa.string()) for c in HUB_COLUMNS])


def _bundled_rows() -> list[dict[str, Any]]:
    return [json.loads(line) for line in (BUNDLED_DIR / "tasks.jsonl").read_text().splitlines() if line.strip()]


def _hub_rows() -> list[dict[str, str]]:
    """The bundled instances as the hub publishes SWE-bench: its columns only, the test lists JSON-encoded. (The
    bundled rows' floe fields all hold their defaults, so leaving them out changes no task.)"""
    return [
        {c: json.dumps(r[c]) if c in ("FAIL_TO_PASS", "PASS_TO_PASS") else r[c] for c in HUB_COLUMNS}
        for r in _bundled_rows()
    ]


def _user_set(tmp_path: Path, name: str) -> Path:
    """A task file's folder with the bundled snapshots as its ``repos/`` (the layout a user's set has)."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "repos").symlink_to(BUNDLED_DIR / "repos")
    return folder


def _dumped(ts: TaskSet) -> list[dict[str, Any]]:
    return [t.model_dump(mode="json") | {"snapshot": t.snapshot and t.snapshot.name} for t in ts]


def test_hub_jsonl_and_parquet_load_to_the_bundled_tasks(tmp_path: Path) -> None:
    bundled = TaskSet.bundled()
    jsonl = _user_set(tmp_path, "jsonl") / "swe-bench.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in _hub_rows()))
    parquet = _user_set(tmp_path, "parquet") / "test-00000-of-00001.parquet"
    pq.write_table(pa.Table.from_pylist(_hub_rows(), schema=HUB_SCHEMA), parquet)
    assert pq.read_schema(parquet).field("FAIL_TO_PASS").type == pa.string()

    for path in (jsonl, parquet):
        ts = TaskSet.from_source(str(path))  # resolved as a service resolves a task_source
        assert ts.name == path.stem
        assert _dumped(ts) == _dumped(bundled)
        assert ts.digest == bundled.digest, "same instances and snapshots, whatever the file format"
        assert all(t.snapshot is not None and t.snapshot.parent == path.parent / "repos" for t in ts)


def test_parquet_list_columns_nulls_timestamps_and_extra_columns(tmp_path: Path) -> None:
    # Other exports type some columns differently: real lists, a null hints_text, a timestamp, extra columns.
    row = _bundled_rows()[0]
    schema = pa.schema(
        [
            ("instance_id", pa.string()),
            ("repo", pa.string()),
            ("base_commit", pa.string()),
            ("problem_statement", pa.string()),
            ("patch", pa.string()),
            ("test_patch", pa.string()),
            ("FAIL_TO_PASS", pa.list_(pa.string())),
            ("PASS_TO_PASS", pa.list_(pa.string())),
            ("prepare", pa.list_(pa.string())),
            ("hints_text", pa.string()),
            ("created_at", pa.timestamp("s", tz="UTC")),
            ("difficulty", pa.string()),
        ]
    )
    data = {k: row[k] for k in schema.names if k in row} | {
        "hints_text": None,
        "created_at": datetime.datetime(2026, 1, 4, 12, tzinfo=datetime.UTC),
        "difficulty": "<15 min fix",
        "prepare": ["true"],
    }
    path = _user_set(tmp_path, "typed") / "set.parquet"
    pq.write_table(pa.Table.from_pylist([data], schema=schema), path)
    task = TaskSet.from_file(path).get(row["instance_id"])
    lists = task.model_dump(include={"FAIL_TO_PASS", "PASS_TO_PASS"})
    assert lists == {k: row[k] for k in ("FAIL_TO_PASS", "PASS_TO_PASS")}
    assert task.prepare == ["true"] and task.hints_text == "" and task.created_at == "2026-01-04T12:00:00+00:00"
    assert task.snapshot is not None


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("tests/test_x.py::test_a", "a string that is not JSON"),
        ('"tests/test_x.py::test_a"', "JSON list of strings"),
        ('{"tests/test_x.py": "test_a"}', "JSON list of strings"),
        ("[1, 2]", "JSON list of strings"),
    ],
)
def test_a_test_list_that_is_not_a_json_list_of_strings_names_file_row_instance_and_field(
    tmp_path: Path, value: str, message: str
) -> None:
    rows = _hub_rows()[:2]
    rows[1]["PASS_TO_PASS"] = value
    iid = rows[1]["instance_id"]
    jsonl = tmp_path / "set.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(TaskSetError) as caught:
        TaskSet.from_file(jsonl)
    text = str(caught.value)
    assert text.startswith(f"{jsonl}:2: invalid instance {iid!r}: PASS_TO_PASS: ") and message in text
    parquet = tmp_path / "set.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=HUB_SCHEMA), parquet)
    with pytest.raises(TaskSetError) as caught:
        TaskSet.from_file(parquet)
    text = str(caught.value)
    assert text.startswith(f"{parquet}: row 2: invalid instance {iid!r}: PASS_TO_PASS: ") and message in text


def test_unreadable_files_and_missing_fields_are_named(tmp_path: Path) -> None:
    bad = tmp_path / "broken.parquet"
    bad.write_bytes(b"not parquet at all")
    with pytest.raises(TaskSetError, match=f"cannot read task set {bad}"):
        TaskSet.from_source(str(bad))
    with pytest.raises(TaskSetError, match="cannot read task set"):
        TaskSet.from_file(tmp_path / "absent.parquet")
    no_statement = tmp_path / "partial.parquet"
    pq.write_table(pa.Table.from_pylist([{"instance_id": "a__b-1"}]), no_statement)
    with pytest.raises(TaskSetError, match=r"row 1: invalid instance 'a__b-1': problem_statement: Field required"):
        TaskSet.from_file(no_statement)
    jsonl = tmp_path / "list.jsonl"
    jsonl.write_text("[1, 2]\n")
    with pytest.raises(TaskSetError, match=":1: an instance must be an object"):
        TaskSet.from_file(jsonl)


def test_a_numeric_version_keeps_its_text(tmp_path: Path) -> None:
    row: dict[str, Any] = _hub_rows()[0]
    row["version"] = 3.0  # what a pandas round trip writes for "3.0"
    path = tmp_path / "set.jsonl"
    path.write_text(json.dumps(row) + "\n")
    assert TaskSet.from_file(path).get(row["instance_id"]).version == "3.0"


def test_a_bundle_of_all_refs_shows_the_agent_no_commit_past_the_base(tmp_path: Path) -> None:
    # A user's `git bundle create x.bundle --all` from a repository that also holds the fix (and a release tag after
    # it): the materialized tree names the base commit only, so `git log --all`, branches, tags and the reflog do
    # not lead the agent to the fix.
    repo = tmp_path / "src"
    env = ["-c", "user.name=t", "-c", "user.email=t@localhost"]

    def git(*args: str, cwd: Path = repo) -> str:
        return subprocess.run(["git", *env, *args], cwd=cwd, capture_output=True, text=True, check=True).stdout

    repo.mkdir()
    git("init", "-q", "-b", "main")
    (repo / "f.py").write_text("x = 1\n")
    git("add", "f.py")
    git("commit", "-qm", "base")
    base = git("rev-parse", "HEAD").strip()
    (repo / "f.py").write_text("x = 2\n")
    git("commit", "-qam", "the fix")
    git("tag", "v1.0")
    (tmp_path / "repos").mkdir()
    git("bundle", "create", "-q", str(tmp_path / "repos" / "acme__f.bundle"), "--all")
    (tmp_path / "set.jsonl").write_text(
        json.dumps({"instance_id": "acme__f-1", "repo": "acme/f", "base_commit": base, "problem_statement": "p"}) + "\n"
    )
    tree = TaskSet.from_file(tmp_path / "set.jsonl").get("acme__f-1").materialize(tmp_path / "ws")
    assert git("log", "--all", "--format=%H", cwd=tree).split() == [base]
    assert git("for-each-ref", cwd=tree) == "" and git("reflog", cwd=tree) == ""
    assert git("rev-parse", "HEAD", cwd=tree).strip() == base and (tree / "f.py").read_text() == "x = 1\n"
