"""Hostile and broken diffs, graded under the real bwrap backend. Each must end unresolved with a reason (or
error where the fault is ours), leave nothing behind outside the sandbox, and the grader must keep serving."""

from __future__ import annotations

import http.server
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from contracts import Outcome
from floe_tasks import BUNDLED_DIR, Task, TaskSet
from scorer.grader import Grader

TASK_ID = "floe__seqtools-1"
CORE = "seqtools/core.py"
FIXED_CHUNK = """

def chunk(items, size):
    return [list(items[i:i + size]) for i in range(0, len(items), size)]
"""

MakeDiff = Callable[[Task, dict[str, str | None]], str]


@pytest.fixture(scope="module")
def task(bundled: TaskSet) -> Task:
    return bundled.get(TASK_ID)


def _core(task: Task) -> str:
    for line in task.patch.splitlines():
        assert not line.startswith("+++ b/tests"), "gold patch must not touch tests"
    # the base content of the module, from a materialized tree
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        return (task.materialize(Path(tmp) / "t") / CORE).read_text()


def _sandbox_uid_processes(first_uid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            uid_line = next(ln for ln in (entry / "status").read_text().splitlines() if ln.startswith("Uid:"))
        except (OSError, StopIteration):
            continue
        if first_uid <= int(uid_line.split()[1]) < first_uid + 16:
            pids.append(int(entry.name))
    return pids


def _job_dirs(grader: Grader) -> list[Path]:
    return list(grader.work_dir.glob("job-*"))


def _assert_contained(grader: Grader) -> None:
    first_uid = grader.sandbox.first_uid  # type: ignore[attr-defined]
    deadline = time.monotonic() + 5
    while _sandbox_uid_processes(first_uid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _sandbox_uid_processes(first_uid) == [], "sandboxed processes survived the job"
    assert _job_dirs(grader) == [], "job directories left behind"


def test_sanity_gold_and_fixed_module_resolve(grader: Grader, task: Task, make_diff: MakeDiff) -> None:
    # the hostile cases below are only meaningful if an honest fix of the same file resolves
    assert grader.grade(task, task.patch).outcome is Outcome.RESOLVED
    honest = make_diff(task, {CORE: _core(task) + FIXED_CHUNK})
    assert grader.grade(task, honest).outcome is Outcome.RESOLVED


def test_a_missing_snapshot_is_an_error_not_the_agents_failure(grader: Grader, task: Task, tmp_path: Path) -> None:
    # A user's JSONL without its repos/ folder: the gold patch used to "not apply" to an empty tree, reward 0, so the
    # sample trained as the agent's failure. It is ours: ERROR (masked), and the reason says what is missing.
    jsonl = tmp_path / "tasks.jsonl"
    jsonl.write_text(task.model_dump_json() + "\n")
    orphan = TaskSet.from_jsonl(jsonl).get(task.instance_id)
    assert orphan.snapshot is None
    result = grader.grade(orphan, task.patch)
    assert result.outcome is Outcome.ERROR, result.reason
    assert "no repository snapshot" in result.reason and f"repos/{task.instance_id}.bundle" in result.reason
    assert _job_dirs(grader) == []


def test_a_listed_test_that_never_ran_is_reported_missing(grader: Grader, task: Task) -> None:
    # PASS_TO_PASS names a test in a file the eval does not run: the gold patch is unresolved (SWE-bench's verdict),
    # and the report says the test was never collected instead of "broken".
    ghost = "tests/test_elsewhere.py::test_ghost"
    listed = task.model_copy(update={"PASS_TO_PASS": [*task.PASS_TO_PASS, ghost]}).with_snapshot(task.snapshot)
    result = grader.grade(listed, task.patch)
    assert result.outcome is Outcome.UNRESOLVED
    assert result.tests[ghost] == "MISSING" and ghost in result.pass_to_pass["failure"]
    assert "1 PASS_TO_PASS broken (1 of them never ran" in result.reason


def test_editing_tests_is_undone(grader: Grader, task: Task, make_diff: MakeDiff) -> None:
    diff = make_diff(task, {"tests/test_core.py": "def test_chunk_keeps_partial_tail():\n    pass\n"})
    res = grader.grade(task, diff)
    assert res.outcome is Outcome.UNRESOLVED and res.reward == 0
    assert res.tests["tests/test_core.py::test_chunk_keeps_partial_tail"] == "FAILED"
    _assert_contained(grader)


def test_deleting_tests_is_undone(grader: Grader, task: Task, make_diff: MakeDiff) -> None:
    res = grader.grade(task, make_diff(task, {"tests/test_core.py": None}))
    assert res.outcome is Outcome.UNRESOLVED
    assert "FAIL_TO_PASS" in res.reason


CONFTEST = """
import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome = "passed"


def pytest_sessionfinish(session, exitstatus):
    session.exitstatus = 0
"""


def test_conftest_forcing_passes_is_reverted(grader: Grader, task: Task, make_diff: MakeDiff) -> None:
    diff = make_diff(task, {"conftest.py": CONFTEST, "tests/conftest.py": CONFTEST})
    res = grader.grade(task, diff)
    assert res.outcome is Outcome.UNRESOLVED, res.reason
    assert "floe reverted test infrastructure: conftest.py" in res.log_tail


def test_conftest_would_fool_plain_swebench_rules(grader: Grader, task: Task, make_diff: MakeDiff) -> None:
    # Why the hardening exists: without it the forged conftest resolves the task.
    plain = Grader(grader.sandbox, grader.testenv, grader.work_dir, grader.limits, protect_test_infra=False)
    res = plain.grade(task, make_diff(task, {"conftest.py": CONFTEST}))
    assert res.outcome is Outcome.RESOLVED


@pytest.mark.parametrize("stmt", ["import sys\nsys.exit(0)\n", "import os\nos._exit(0)\n"])
def test_exit_at_import(grader: Grader, task: Task, make_diff: MakeDiff, stmt: str) -> None:
    res = grader.grade(task, make_diff(task, {CORE: stmt + _core(task) + FIXED_CHUNK}))
    assert res.outcome is Outcome.UNRESOLVED and res.reward == 0
    assert res.reason


@pytest.mark.slow
def test_infinite_loop_is_stopped(grader: Grader, task: Task, make_diff: MakeDiff) -> None:
    t0 = time.monotonic()
    res = grader.grade(task, make_diff(task, {CORE: "while True:\n    pass\n" + _core(task)}))
    assert res.outcome is Outcome.UNRESOLVED
    assert res.reason.endswith("the test run was killed by SIGXCPU: the CPU-time limit (RLIMIT_CPU)"), res.reason
    assert time.monotonic() - t0 < grader.limits.wall_s + 5
    _assert_contained(grader)


@pytest.mark.slow
def test_fork_bomb_is_contained(grader: Grader, task: Task, make_diff: MakeDiff) -> None:
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    t0 = time.monotonic()
    res = grader.grade(task, make_diff(task, {CORE: bomb + _core(task)}))
    assert res.outcome is Outcome.UNRESOLVED
    assert time.monotonic() - t0 < grader.limits.wall_s + 5
    _assert_contained(grader)


def test_unbounded_memory(grader: Grader, task: Task, make_diff: MakeDiff) -> None:
    hog = "blocks = []\nwhile True:\n    blocks.append(bytearray(50 * 1024 * 1024))\n"
    res = grader.grade(task, make_diff(task, {CORE: hog + _core(task) + FIXED_CHUNK}))
    assert res.outcome is Outcome.UNRESOLVED
    _assert_contained(grader)


def test_disk_fill(grader: Grader, task: Task, make_diff: MakeDiff) -> None:
    fill = (
        "import itertools\n"
        "for i in itertools.count():\n"
        "    try:\n"
        "        with open(f'fill-{i}.bin', 'wb') as fh:\n"
        "            fh.write(b'x' * (4 * 1024 * 1024))\n"
        "    except OSError:\n"
        "        break\n"
        "    if i > 500:\n"
        "        break\n"
    )
    vfs = os.statvfs(grader.work_dir)
    before = vfs.f_bavail * vfs.f_frsize
    res = grader.grade(task, make_diff(task, {CORE: fill + _core(task)}))
    assert res.outcome is Outcome.UNRESOLVED and res.reward == 0
    # writes land in the sandbox's size-capped tmpfs; the host disk is untouched (an escape would write ~2 GB)
    vfs = os.statvfs(grader.work_dir)
    assert before - vfs.f_bavail * vfs.f_frsize < 256 * 1024 * 1024
    _assert_contained(grader)


@pytest.fixture
def host_server() -> Iterator[tuple[int, list[str]]]:
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], hits
    server.shutdown()
    server.server_close()


def test_network_is_unreachable(
    grader: Grader, task: Task, make_diff: MakeDiff, host_server: tuple[int, list[str]]
) -> None:
    port, hits = host_server
    # the module behaves correctly only if the network call succeeds
    code = (
        "import urllib.request\n"
        "try:\n"
        f"    urllib.request.urlopen('http://127.0.0.1:{port}/exfil', timeout=2)\n"
        "    NET = True\n"
        "except Exception:\n"
        "    NET = False\n" + _core(task) + "\nif NET:\n" + FIXED_CHUNK.replace("\n", "\n    ")
    )
    res = grader.grade(task, make_diff(task, {CORE: code}))
    assert hits == []
    assert res.outcome is Outcome.UNRESOLVED


def test_cannot_read_gold_or_other_sessions_or_write_outside(
    grader: Grader, task: Task, make_diff: MakeDiff, tmp_path: Path
) -> None:
    other = grader.work_dir / "other-session-secret.txt"
    other.write_text("secret")
    other.chmod(0o644)
    outside = Path("/var/tmp") / f"floe-hostile-{os.getpid()}.txt"
    gold = BUNDLED_DIR / "tasks.jsonl"
    code = (
        "import os\n"
        "SEEN = []\n"
        f"for p in [{str(gold)!r}, {str(other)!r}, '/root', '/work']:\n"
        "    try:\n"
        "        open(p).read() if not os.path.isdir(p) else os.listdir(p)\n"
        "        SEEN.append(p)\n"
        "    except OSError:\n"
        "        pass\n"
        "try:\n"
        f"    open({str(outside)!r}, 'w').write('x')\n"
        "except OSError:\n"
        "    pass\n" + _core(task) + "\nif SEEN:\n" + FIXED_CHUNK.replace("\n", "\n    ")
    )
    res = grader.grade(task, make_diff(task, {CORE: code}))
    assert res.outcome is Outcome.UNRESOLVED, f"sandbox could read: {res.log_tail[-500:]}"
    assert not outside.exists()
    assert other.read_text() == "secret"
    other.unlink()


def test_malformed_binary_huge_empty(grader: Grader, task: Task) -> None:
    garbage = grader.grade(task, "this is not a diff\n@@ nonsense @@\n")
    assert garbage.outcome is Outcome.UNRESOLVED and garbage.reason == "patch did not apply"
    binary = (
        "diff --git a/blob.bin b/blob.bin\nnew file mode 100644\nindex 0000000..1111111\n"
        "GIT binary patch\nliteral 10\nRcmZ?wbhEHbJ;o0Dzx%SO1\n\nliteral 0\nHcmV?d00001\n\n"
    )
    res = grader.grade(task, binary)
    assert res.outcome is Outcome.UNRESOLVED
    assert grader.grade(task, "\x00\x01\x02").outcome is Outcome.UNRESOLVED
    huge = grader.grade(task, "+" * (grader.max_diff_bytes + 1))
    assert huge.outcome is Outcome.UNRESOLVED and "too large" in huge.reason
    empty = grader.grade(task, "")
    assert empty.outcome is Outcome.UNRESOLVED and empty.reason == "empty patch"
    _assert_contained(grader)


def test_grader_still_serves_after_hostile_inputs(grader: Grader, task: Task) -> None:
    assert grader.grade(task, task.patch).outcome is Outcome.RESOLVED
