"""A task set: an ordered collection of ``Task`` s loaded from JSONL or Parquet, with a content digest.

``TaskSet.from_source(name_or_path)`` resolves a ``task_source`` (a shipped set's name — ``bundled``, ``toy``,
``count``, ``count-heldout`` — or the path of a task file).
``TaskSet.bundled()`` is floe's own set (package data: ``bundled/tasks.jsonl`` + ``bundled/repos/<id>.bundle``).
``TaskSet.from_file(path)`` reads a file of SWE-bench-format instances by its suffix: ``.parquet`` (one row per
instance, as the dataset hub exports SWE-bench; ``from_parquet``) or anything else as JSONL (``from_jsonl``).
Snapshots are looked up in ``repos_dir`` (default: ``<file's dir>/repos``) as ``<instance_id>.bundle`` or
``<owner>__<name>.bundle``. A null column reads as an absent one (its default applies), in both formats.
``digest`` hashes the instances and the bundle bytes, so caches keyed by it (gold validation) invalidate when
anything graded changes; the same instances give the same digest whichever format they came in.

Limits: Parquet needs ``pyarrow`` (imported only when a ``.parquet`` file is read); a Parquet file is read whole.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from floe_tasks.errors import TaskNotFound, TaskSetError
from floe_tasks.task import Task

__all__ = ["BUNDLED_DIR", "COUNT_DIR", "NAMED_SETS", "TOY_DIR", "TaskSet"]

BUNDLED_DIR = Path(__file__).parent / "bundled"
TOY_DIR = Path(__file__).parent / "toy"
COUNT_DIR = Path(__file__).parent / "count"
# Task sets shipped inside the package, by the name a ``SessionRequested.task_source`` may use -> their JSONL file
# (snapshots in ``repos/`` next to it). ``count`` / ``count-heldout`` are the real-model demo's training and held-out
# sets (libs/tasks/tools/build_toy.py): disjoint numbers, so the held-out solve rate is never trained on.
NAMED_SETS = {
    "bundled": BUNDLED_DIR / "tasks.jsonl",
    "toy": TOY_DIR / "tasks.jsonl",
    "count": COUNT_DIR / "train.jsonl",
    "count-heldout": COUNT_DIR / "heldout.jsonl",
}


class TaskSet:
    """Immutable, ordered tasks by instance id."""

    def __init__(self, tasks: Sequence[Task], *, name: str = "tasks") -> None:
        self.name = name
        self._tasks: dict[str, Task] = {}
        for task in tasks:
            if task.instance_id in self._tasks:
                raise TaskSetError(f"duplicate instance_id {task.instance_id!r} in {name}")
            self._tasks[task.instance_id] = task

    @classmethod
    @functools.cache
    def bundled(cls) -> TaskSet:
        """floe's bundled task set (cached: it is immutable package data)."""
        return cls.from_source("bundled")

    @classmethod
    @functools.cache
    def from_source(cls, source: str) -> TaskSet:
        """Resolve a ``task_source`` as every service does: a shipped set's name (``NAMED_SETS``) or the path
        of a SWE-bench-format JSONL or Parquet file. Cached per source: task sets are immutable."""
        if source in NAMED_SETS:
            return cls.from_jsonl(NAMED_SETS[source], name=source)
        return cls.from_file(source)

    @classmethod
    def from_file(cls, path: str | Path, *, repos_dir: str | Path | None = None, name: str | None = None) -> TaskSet:
        """A JSONL or (by its ``.parquet`` suffix) Parquet file of instances."""
        if Path(path).suffix.lower() == ".parquet":
            return cls.from_parquet(path, repos_dir=repos_dir, name=name)
        return cls.from_jsonl(path, repos_dir=repos_dir, name=name)

    @classmethod
    def from_jsonl(cls, path: str | Path, *, repos_dir: str | Path | None = None, name: str | None = None) -> TaskSet:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise TaskSetError(f"cannot read task set {path}: {exc}") from exc

        def rows() -> Iterator[tuple[str, Any]]:
            for lineno, line in enumerate(text.splitlines(), start=1):
                if not line.strip():
                    continue
                try:
                    yield f"{path}:{lineno}", json.loads(line)
                except json.JSONDecodeError as exc:
                    raise TaskSetError(f"{path}:{lineno}: not valid JSON: {exc}") from exc

        return cls._from_rows(rows(), path, repos_dir, name)

    @classmethod
    def from_parquet(cls, path: str | Path, *, repos_dir: str | Path | None = None, name: str | None = None) -> TaskSet:
        """A Parquet file with one row per instance and the instance fields as columns (the dataset hub's export:
        FAIL_TO_PASS / PASS_TO_PASS as JSON-encoded strings; list columns work too)."""
        path = Path(path)
        # Imported here, not at module level: only Parquet readers pay for pyarrow (the session runner, for one,
        # never reads a Parquet file for the bundled set).
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except (OSError, pa.ArrowException) as exc:
            raise TaskSetError(f"cannot read task set {path}: {exc}") from exc
        rows = ((f"{path}: row {i}", row) for i, row in enumerate(table.to_pylist(), start=1))
        return cls._from_rows(rows, path, repos_dir, name)

    @classmethod
    def _from_rows(
        cls, rows: Iterable[tuple[str, Any]], path: Path, repos_dir: str | Path | None, name: str | None
    ) -> TaskSet:
        """Validate ``(where, row)`` pairs into tasks with their snapshots; an error names the file, the row (or
        line) and, when the row has one, the instance id."""
        repos = Path(repos_dir) if repos_dir is not None else path.parent / "repos"
        tasks: list[Task] = []
        for where, row in rows:
            if not isinstance(row, dict):
                raise TaskSetError(f"{where}: an instance must be an object, got {type(row).__name__}")
            # A null column is an absent one: Parquet and pandas-made JSONL write null for a missing value.
            fields = {k: v for k, v in row.items() if v is not None}
            try:
                task = Task.model_validate(fields)
            except ValidationError as exc:
                iid = fields.get("instance_id")
                label = f"instance {iid!r}" if isinstance(iid, str) else "instance"
                raise TaskSetError(f"{where}: invalid {label}: {_describe(exc)}") from exc
            tasks.append(task.with_snapshot(_find_bundle(repos, task)))
        return cls(tasks, name=name or path.stem)

    def get(self, instance_id: str) -> Task:
        try:
            return self._tasks[instance_id]
        except KeyError:
            raise TaskNotFound(f"no task {instance_id!r} in task set {self.name!r}") from None

    def ids(self) -> list[str]:
        return list(self._tasks)

    def __iter__(self) -> Iterator[Task]:
        return iter(self._tasks.values())

    def __len__(self) -> int:
        return len(self._tasks)

    def __contains__(self, instance_id: object) -> bool:
        return instance_id in self._tasks

    @functools.cached_property
    def digest(self) -> str:
        """sha256 over every instance (canonical JSON) and the bytes of its snapshot."""
        h = hashlib.sha256()
        for task in self._tasks.values():
            h.update(json.dumps(task.model_dump(mode="json"), sort_keys=True).encode())
            if task.snapshot is not None:
                h.update(hashlib.sha256(task.snapshot.read_bytes()).digest())
        return h.hexdigest()

    def __repr__(self) -> str:
        return f"TaskSet(name={self.name!r}, tasks={len(self)}, digest={self.digest[:12]})"


def _describe(exc: ValidationError) -> str:
    """pydantic's errors on one line, ``field: message; ...`` (its default text adds URLs and input dumps)."""
    parts = []
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"]) or "row"
        msg = str(err["msg"]).removeprefix("Value error, ")
        parts.append(f"{field}: {msg}")
    return "; ".join(parts)


def _find_bundle(repos: Path, task: Task) -> Path | None:
    candidates = [repos / f"{task.instance_id}.bundle"]
    if task.repo:
        candidates.append(repos / f"{task.repo.replace('/', '__')}.bundle")
    return next((c for c in candidates if c.is_file()), None)
