"""The read-only Python test environment the sandbox runs tests with: an interpreter plus a copy of pytest.

Bundled tasks need only the standard library and pytest. We copy the installed ``pytest`` distribution and its
runtime requirements (markers evaluated for this platform) into ``<work_dir>/testenv-<key>/site``, world-readable,
and run tests with a ``python`` wrapper that puts that directory on ``PYTHONPATH``. Copying (instead of binding the
scorer's own venv) keeps floe's packages, and with them the bundled gold patches, out of the sandbox.

The interpreter: ``test_python`` when configured; otherwise the running interpreter when every directory above its
installation is traversable by other users (bubblewrap resolves bind sources as the unprivileged uid;
docs/scorer.md, "Test environment"), else ``/usr/bin/python3``.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import os
import shutil
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement

__all__ = ["TestEnv", "build_testenv", "pick_interpreter"]


@dataclass(frozen=True)
class TestEnv:
    __test__ = False

    python: Path  # the interpreter
    prefix: Path  # its installation, bound read-only (None-like when under /usr)
    site: Path  # copied pytest + requirements

    def wrapper(self) -> str:
        return f'#!/bin/sh\nPYTHONPATH={self.site} exec {self.python} "$@"\n'

    def ro_paths(self) -> list[Path]:
        paths = [self.site]
        if not str(self.prefix).startswith("/usr/"):
            paths.append(self.prefix)
        return paths


def _world_traversable(path: Path) -> bool:
    for parent in [path, *path.parents]:
        try:
            mode = parent.stat().st_mode
        except OSError:
            return False
        if not mode & stat.S_IXOTH:
            return False
    return True


def pick_interpreter(configured: str | None = None) -> tuple[Path, Path]:
    """(interpreter, installation prefix) usable by an unprivileged sandbox uid."""
    if configured:
        exe = Path(configured).resolve()
        return exe, exe.parent.parent
    exe = Path(sys.executable).resolve()
    prefix = Path(sys.base_prefix).resolve()
    if _world_traversable(prefix) and _world_traversable(exe.parent):
        return exe, prefix
    return Path("/usr/bin/python3"), Path("/usr")


def _closure(name: str, seen: dict[str, md.Distribution]) -> None:
    dist = md.distribution(name)
    key = dist.metadata["Name"].lower()
    if key in seen:
        return
    seen[key] = dist
    for spec in dist.requires or []:
        req = Requirement(spec)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        _closure(req.name, seen)


def build_testenv(work_dir: Path, configured_python: str | None = None) -> TestEnv:
    """Create (once; cached by content) the copied test site and return the environment."""
    python, prefix = pick_interpreter(configured_python)
    dists: dict[str, md.Distribution] = {}
    _closure("pytest", dists)
    key = hashlib.sha256(
        (str(python) + "".join(f"{k}={d.version}" for k, d in sorted(dists.items()))).encode()
    ).hexdigest()[:12]
    root = work_dir / f"testenv-{key}"
    site = root / "site"
    if not (root / "ready").exists():
        tmp = work_dir / f".testenv-{key}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "site").mkdir(parents=True)
        for dist in dists.values():
            for rel in dist.files or []:
                if ".." in rel.parts or rel.suffix == ".pyc":
                    continue
                src = Path(str(dist.locate_file(rel)))
                if not src.is_file():
                    continue
                dest = tmp / "site" / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dest)
        for dirpath, dirnames, filenames in os.walk(tmp):
            for d in dirnames:
                os.chmod(os.path.join(dirpath, d), 0o755)
            for f in filenames:
                os.chmod(os.path.join(dirpath, f), 0o644)
        tmp.chmod(0o755)
        (tmp / "ready").write_text("ok\n")
        try:
            tmp.rename(root)
        except OSError:  # another process won the race; use theirs
            shutil.rmtree(tmp, ignore_errors=True)
    return TestEnv(python=python, prefix=prefix, site=site)
