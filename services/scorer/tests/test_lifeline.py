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

# The child: the scorer's own grading path. In "spawn" mode a watcher thread kills the process the moment a child
# of it runs the bwrap command line (still setpriv/prlimit, about to exec bwrap).
CHILD = r"""
import json, os, signal, sys, threading
from pathlib import Path

from floe_tasks import TaskSet
from scorer.factory import make_grader
from scorer.settings import ScorerSettings

settings = ScorerSettings(**json.loads(sys.argv[1]))
diff = Path(sys.argv[2]).read_text()
grader, probe = make_grader(settings)
assert probe.level == "A", probe.detail
task = TaskSet.bundled().get(sys.argv[4])


def die_at_spawn() -> None:
    me = os.getpid()
    tasks = Path(f"/proc/{me}/task")
    while True:
        for children in tasks.glob("*/children"):
            try:
                pids = children.read_text().split()
            except OSError:
                continue
            for pid in pids:
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                if b"bwrap" in cmdline:
                    os.kill(me, signal.SIGKILL)


if sys.argv[3] == "spawn":
    threading.Thread(target=die_at_spawn, daemon=True).start()
print("grading", flush=True)
grader.grade(task, diff)
print("graded", flush=True)
"""


def _survivors(first_uid: int, marker: str) -> list[int]:
    """Live (non-zombie) host processes of the job's uid block, or carrying ``marker`` on their command line."""
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
        if first_uid <= uid < first_uid + 16 or marker.encode() in cmdline:
            found.append(int(entry.name))
    return found


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
    # A uid block of its own (no other job of this test session may look like a survivor) and a wall clock far
    # beyond the test: only the scorer's death may end this job.
    first_uid = settings.first_uid + 16 * (1 + ["running", "spawn"].index(moment))
    child_settings = settings.model_copy(update={"first_uid": first_uid, "timeout_s": 300.0, "workers": 1})
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, child_settings.model_dump_json(), str(diff_file), moment, TASK_ID],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        if moment == "running":
            assert _wait_for(lambda: any(_survivors(-16, marker)[:1]) or child.poll() is not None, 60), "no daemon"
            assert child.poll() is None, child.communicate()
            child.send_signal(signal.SIGKILL)
        _out, err = child.communicate(timeout=120)
        assert child.returncode == -signal.SIGKILL, err.decode()[-2000:]
        gone = _wait_for(lambda: _survivors(first_uid, marker) == [], 10)
        left = _survivors(first_uid, marker)
        assert gone, f"the grading job outlived the scorer: {[_cmdline(pid) for pid in left]}"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        for pid in _survivors(first_uid, marker):  # only what this test started (its uid block or marker)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return f"{pid} (gone)"
