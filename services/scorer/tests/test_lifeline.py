"""A grading job never outlives the scorer that started it.

The scorer runs in a child process and grades, through its own code path (``make_grader`` -> ``Grader.grade``), a
diff whose module daemonises a process at import and then hangs. The child is then SIGKILLed, which is what a crash
or an OOM kill does: the kernel closes the write end of every sandbox's lifeline. Two moments:

- ``running``: once the daemon is up (bwrap's ``--die-with-parent`` alone already covers this one);
- ``spawn``: the instant the sandbox command is forked, before bwrap has armed ``--die-with-parent``. Without the
  lifeline that sandbox is orphaned and runs until its own script ends (here: never, the wall clock was the dead
  scorer's). This is the case the lifeline exists for.

Either way, within seconds no process of the job's uid block and no daemon may be left.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from floe_tasks import Task, TaskSet
from scorer.settings import ScorerSettings

TASK_ID = "floe__seqtools-1"
CORE = "seqtools/core.py"

# The child: the scorer's own grading path. In "spawn" mode a watcher thread freezes the sandbox command the moment
# it is forked (before bwrap can arm --die-with-parent), records its pid, and kills the process.
CHILD = r"""
import json, os, signal, sys, threading, time
from pathlib import Path

from floe_tasks import TaskSet
from scorer.factory import make_grader
from scorer.settings import ScorerSettings

settings = ScorerSettings(**json.loads(sys.argv[1]))
diff = Path(sys.argv[2]).read_text()
moment, task_id, pid_file = sys.argv[3:6]
grader, probe = make_grader(settings)
assert probe.level == "A", probe.detail
task = TaskSet.bundled().get(task_id)


def state(pid: str) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def die_at_spawn() -> None:
    # Freeze the sandbox command before bwrap runs, so the scorer is certainly dead before bwrap can arm
    # --die-with-parent, then die.
    me = os.getpid()
    while True:
        for children in Path(f"/proc/{me}/task").glob("*/children"):
            try:
                pids = children.read_text().split()
            except OSError:
                continue
            for pid in pids:
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                    session = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3]
                except OSError:
                    continue
                # The sandbox command is the child that leads its own session (git and the like do not); wanted
                # from its setsid on, and before bwrap runs (still python, prlimit or setpriv).
                if session != pid:
                    continue
                if os.path.basename(cmdline.split(b"\0")[0]) == b"bwrap":
                    print("missed the window", flush=True)
                    os._exit(3)
                os.kill(int(pid), signal.SIGSTOP)
                while state(pid) != "T":
                    time.sleep(0.001)
                Path(pid_file).write_text(pid)
                os.kill(me, signal.SIGKILL)


if moment == "spawn":
    threading.Thread(target=die_at_spawn, daemon=True).start()
print("grading", flush=True)
grader.grade(task, diff)
print("graded", flush=True)
"""


def _survivors(first_uid: int, marker: str, pids: list[int]) -> list[int]:
    """Live (non-zombie) host processes of the job's uid block, carrying ``marker`` on their command line, or in
    ``pids``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields.get("State", "").split()[:1] == ["Z"]:
            continue
        uid = int(fields["Uid"].split()[1])
        if first_uid <= uid < first_uid + 16 or marker.encode() in cmdline or int(entry.name) in pids:
            found.append(int(entry.name))
    return found


def _marked(marker: str) -> list[int]:
    """Host processes carrying ``marker`` on their command line: the daemon has started."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _daemon_up_or_exited(marker: str, child: subprocess.Popen[bytes]) -> bool:
    return bool(_marked(marker)) or child.poll() is not None


def _wait_for(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


@pytest.mark.parametrize("moment", ["running", "spawn"])
def test_a_grading_job_dies_with_the_scorer(
    settings: ScorerSettings,
    bundled: TaskSet,
    make_diff: Callable[[Task, dict[str, str | None]], str],
    tmp_path: Path,
    moment: str,
) -> None:
    task = bundled.get(TASK_ID)
    marker = f"floe-orphan-{os.getpid()}-{moment}"
    base = (task.materialize(tmp_path / "base") / CORE).read_text()
    daemonise = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', "
        f"{marker!r}], start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, "
        "stderr=subprocess.DEVNULL)\n"
        "time.sleep(300)\n"
    )
    diff_file = tmp_path / "hostile.diff"
    diff_file.write_text(make_diff(task, {CORE: daemonise + base}))
    pid_file = tmp_path / "sandbox.pid"
    # A uid block of its own (no other job of this test session may look like a survivor) and a wall clock far
    # beyond the test: only the scorer's death may end this job.
    first_uid = settings.first_uid + 16 * (1 + ["running", "spawn"].index(moment))
    child_settings = settings.model_copy(update={"first_uid": first_uid, "timeout_s": 300.0, "workers": 1})
    argv = [
        sys.executable,
        "-c",
        CHILD,
        child_settings.model_dump_json(),
        str(diff_file),
        moment,
        TASK_ID,
        str(pid_file),
    ]
    sandbox: list[int] = []
    child: subprocess.Popen[bytes] | None = None
    try:
        for _attempt in range(5):
            # TMPDIR: the sandbox's private run directory, which a killed scorer cannot remove, lands in the
            # test session's work directory (removed with it)
            env = {**os.environ, "TMPDIR": str(settings.work_dir)}
            child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
            if moment == "running":
                assert _wait_for(functools.partial(_daemon_up_or_exited, marker, child), 60), "no daemon"
                assert child.poll() is None, child.communicate()
                child.send_signal(signal.SIGKILL)
            out, err = child.communicate(timeout=120)
            if moment == "spawn" and child.returncode == 3 and b"missed the window" in out:
                _kill(_survivors(first_uid, marker, []))  # a scheduling miss is no verdict: again
                continue
            break
        else:
            pytest.fail("the watcher never froze the sandbox command before bwrap ran")
        assert child.returncode == -signal.SIGKILL, (out + err).decode()[-2000:]
        if moment == "spawn":
            # The scorer is dead; let its frozen sandbox command go on, as a slow exec would have.
            sandbox.append(int(pid_file.read_text()))
            os.kill(sandbox[0], signal.SIGCONT)
        gone = _wait_for(lambda: _survivors(first_uid, marker, sandbox) == [], 10)
        left = _survivors(first_uid, marker, sandbox)
        assert gone, f"the grading job outlived the scorer: {[_cmdline(pid) for pid in left]}"
    finally:
        if child is not None and child.poll() is None:
            child.kill()
            child.wait()
        _kill(_survivors(first_uid, marker, sandbox))  # only what this test started


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return f"{pid} (gone)"
