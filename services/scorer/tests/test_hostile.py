"""Hostile and broken diffs, graded under the real bwrap backend. Each must end unresolved with a reason (or
error where the fault is ours), leave nothing behind outside the sandbox, and the grader must keep serving."""

from __future__ import annotations

import dataclasses
import http.server
import os
import platform
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from contracts import Outcome
from floe_tasks import BUNDLED_DIR, Task, TaskSet
from sandbox.cgroup import Cgroup, CgroupUnavailable, parent_dirs
from sandbox.seccomp import ARCHES
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


def _job_cgroups() -> list[Path]:
    """The jobs' cgroups made by this (test) process that still exist: none once a job has ended."""
    return [d for parent in parent_dirs() if parent.is_dir() for d in parent.glob(f"sbx-{os.getpid()}-*")]


def _assert_contained(grader: Grader) -> None:
    first_uid = grader.sandbox.first_uid  # type: ignore[attr-defined]
    deadline = time.monotonic() + 5
    while _sandbox_uid_processes(first_uid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _sandbox_uid_processes(first_uid) == [], "sandboxed processes survived the job"
    assert _job_dirs(grader) == [], "job directories left behind"
    assert _job_cgroups() == [], "job cgroups left behind"


@pytest.fixture(scope="module")
def cgroups() -> None:
    """Skip a test that needs the cgroup limits where this machine has none (the rlimits still hold there)."""
    try:
        Cgroup.create(memory_bytes=64 * 1024**2, pids=8).remove()
    except CgroupUnavailable as exc:
        pytest.skip(f"no cgroup limits here: {exc}")


@pytest.fixture
def small(grader: Grader) -> Grader:
    """The same sandbox with small limits, so an attack on them ends in about a second: 192 MiB of memory for the
    whole job (pytest needs ~40), 32 processes, 8 s of wall clock."""
    limits = dataclasses.replace(grader.limits, memory_bytes=192 * 1024**2, nproc=32, wall_s=8.0)
    return Grader(grader.sandbox, grader.testenv, grader.work_dir, limits)


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


def test_fork_bomb_hits_the_process_limit(cgroups: None, small: Grader, task: Task, make_diff: MakeDiff) -> None:
    # Forks until the kernel refuses (the job's cgroup, pids.max = nproc), then goes on: the reason names the limit.
    bomb = (
        "import os, time\n"
        "try:\n"
        "    while True:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(1)\n"
        "            os._exit(0)\n"
        "except OSError:\n"
        "    pass\n"
    )
    res = small.grade(task, make_diff(task, {CORE: bomb + _core(task)}))
    assert res.outcome is Outcome.UNRESOLVED and res.reward == 0, res.reason
    assert res.reason.endswith("; the process-count limit (cgroup, 32) fired"), res.reason
    _assert_contained(small)


def test_endless_fork_bomb_times_out_with_the_process_limit_named(
    cgroups: None, small: Grader, task: Task, make_diff: MakeDiff
) -> None:
    # Never ends by itself: held at 32 processes until the wall clock (3 s here) kills the job.
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    short = Grader(small.sandbox, small.testenv, small.work_dir, dataclasses.replace(small.limits, wall_s=3.0))
    res = short.grade(task, make_diff(task, {CORE: bomb + _core(task)}))
    assert res.outcome is Outcome.UNRESOLVED and res.reward == 0
    assert res.reason == "tests timed out after 3s; the process-count limit (cgroup, 32) fired", res.reason
    _assert_contained(short)


def test_unbounded_memory(grader: Grader, task: Task, make_diff: MakeDiff) -> None:
    hog = "blocks = []\nwhile True:\n    blocks.append(bytearray(50 * 1024 * 1024))\n"
    res = grader.grade(task, make_diff(task, {CORE: hog + _core(task) + FIXED_CHUNK}))
    assert res.outcome is Outcome.UNRESOLVED
    _assert_contained(grader)


def test_memory_bomb_is_killed_by_the_memory_limit(
    cgroups: None, small: Grader, task: Task, make_diff: MakeDiff
) -> None:
    # The job's cgroup (192 MiB here) is below RLIMIT_AS, so the kernel's OOM killer ends pytest, and the reason
    # says so: the agent's failure (reward 0, scored), not an infrastructure error.
    hog = "blocks = []\nwhile True:\n    blocks.append(bytearray(16 * 1024 * 1024))\n"
    res = small.grade(task, make_diff(task, {CORE: hog + _core(task) + FIXED_CHUNK}))
    assert res.outcome is Outcome.UNRESOLVED and res.reward == 0
    assert res.reason.endswith("the test run was killed: memory limit (cgroup, 192.0 MiB)"), res.reason
    _assert_contained(small)


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


def test_disk_fill_of_the_workspace_and_tmp_gets_enospc(grader: Grader, task: Task, make_diff: MakeDiff) -> None:
    # The module is correct only if both tmpfs (the testbed and /tmp, 32 MiB each) said ENOSPC, never more: the
    # grader is the witness of what happened inside (RESOLVED iff the writes were refused as expected).
    fill = (
        "import errno as _errno, itertools as _it\n"
        "FULL = []\n"
        "for _where in ('.', '/tmp'):\n"
        "    for _i in _it.count():\n"
        "        try:\n"
        "            with open(f'{_where}/fill-{_i}.bin', 'wb') as _fh:\n"
        "                _fh.write(b'x' * (4 * 1024 * 1024))\n"
        "        except OSError as _exc:\n"
        "            FULL.append(_exc.errno == _errno.ENOSPC and _i <= 8)\n"
        "            break\n"
    )
    res = grader.grade(
        task,
        make_diff(
            task, {CORE: fill + _core(task) + "\nif FULL == [True, True]:\n" + FIXED_CHUNK.replace("\n", "\n    ")}
        ),
    )
    assert res.outcome is Outcome.RESOLVED, res.reason
    _assert_contained(grader)


def test_a_file_past_the_size_limit_is_named(grader: Grader, task: Task, make_diff: MakeDiff) -> None:
    # Python ignores SIGXFSZ (it would get EFBIG); a program that does not is killed by it, and the reason says so.
    big = (
        "import signal as _signal\n"
        "_signal.signal(_signal.SIGXFSZ, _signal.SIG_DFL)\n"
        "open('big.bin', 'wb').write(b'x' * (16 * 1024 * 1024))\n"
    )
    res = grader.grade(task, make_diff(task, {CORE: big + _core(task) + FIXED_CHUNK}))
    assert res.outcome is Outcome.UNRESOLVED and res.reward == 0
    assert res.reason.endswith("the test run was killed by SIGXFSZ: the file-size limit (RLIMIT_FSIZE)"), res.reason
    _assert_contained(grader)


# Kernel interfaces a diff has no use for, tried from the module under test. Each must fail with exactly this errno
# (the seccomp filter's answer); the fix is defined only if all did, so RESOLVED means every one was refused.
SYSCALL_ATTACKS = r"""
import ctypes as _ct, errno as _errno, os as _os, socket as _socket
_libc = _ct.CDLL(None, use_errno=True)
_libc.syscall.restype = _ct.c_long
_NR = %(nr)r
def _refused(ret, expected=_errno.EPERM):
    return ret == -1 and _ct.get_errno() == expected
REFUSED = {}
REFUSED["ptrace-attach-parent"] = _refused(_libc.ptrace(16, _os.getppid(), 0, 0))
_child = _os.fork()
if _child == 0:
    _os._exit(0 if _refused(_libc.ptrace(0, 0, 0, 0)) else 1)
REFUSED["ptrace-traceme"] = _os.waitpid(_child, 0)[1] == 0
_os.makedirs("/tmp/floe-m", exist_ok=True)
REFUSED["mount"] = _refused(_libc.mount(b"none", b"/tmp/floe-m", b"tmpfs", 0, None))
REFUSED["keyctl"] = _refused(_libc.syscall(_ct.c_long(_NR["keyctl"]), _ct.c_long(0), _ct.c_long(-3), _ct.c_long(0)))
REFUSED["unshare-user"] = _refused(_libc.unshare(0x10000000))
for _name, _family, _kind in [("raw-socket", _socket.AF_INET, _socket.SOCK_RAW),
                              ("packet-socket", _socket.AF_PACKET, _socket.SOCK_DGRAM)]:
    try:
        _socket.socket(_family, _kind).close()
        REFUSED[_name] = False
    except OSError as _exc:
        REFUSED[_name] = _exc.errno == _errno.EPERM
"""


def test_ptrace_mount_keyctl_unshare_and_raw_sockets_are_refused(
    grader: Grader, task: Task, make_diff: MakeDiff
) -> None:
    attacks = SYSCALL_ATTACKS % {"nr": ARCHES[platform.machine()].syscalls}
    code = (
        attacks
        + _core(task)
        + "\nif all(REFUSED.values()) and len(REFUSED) == 7:\n"
        + FIXED_CHUNK.replace("\n", "\n    ")
    )
    res = grader.grade(task, make_diff(task, {CORE: code}))
    assert res.outcome is Outcome.RESOLVED, f"an attack was not refused with EPERM: {res.reason}"
    _assert_contained(grader)


def test_writes_outside_the_testbed_are_refused(grader: Grader, task: Task, make_diff: MakeDiff) -> None:
    # /usr, /etc, the job's input (/floe), bwrap's root and the host's /root: refused (read-only, or not there),
    # and the host's file is unchanged.
    canary = Path("/root") / f"floe-hostile-canary-{os.getpid()}"
    canary.write_text("host")
    targets = ["/usr/floe-x", "/etc/passwd", "/floe/eval.sh", "/floe/new", "/x", str(canary)]
    code = (
        "import errno as _errno\n"
        "REFUSED = []\n"
        f"for _path in {targets!r}:\n"
        "    try:\n"
        "        open(_path, 'w').write('diff')\n"
        "        REFUSED.append(False)\n"
        "    except OSError as _exc:\n"
        "        REFUSED.append(_exc.errno in (_errno.EROFS, _errno.EACCES, _errno.ENOENT))\n"
        + _core(task)
        + "\nif all(REFUSED):\n"
        + FIXED_CHUNK.replace("\n", "\n    ")
    )
    try:
        res = grader.grade(task, make_diff(task, {CORE: code}))
        assert res.outcome is Outcome.RESOLVED, f"a write outside went through: {res.reason}"
        assert canary.read_text() == "host"
        assert not Path("/usr/floe-x").exists()
    finally:
        canary.unlink()
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
