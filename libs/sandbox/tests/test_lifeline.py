"""Nothing a sandbox started survives its end: kill, a cut lifeline, or the death of the process that launched it.

Each test runs for both shapes the services use (``conftest.shape``: the session runner's and the scorer's), with a
program that leaves a daemon behind (own session, detached stdio) and then hangs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import functools
import os
import pickle
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sandbox import SandboxProcess
from sandbox.cgroup import Cgroup, CgroupUnavailable
from sandbox.command import build_command

from .conftest import Shape, daemon_script, live_pids


async def _started_with_daemon(spec_shape: Shape, scratch: Path, uid: int, marker: str) -> SandboxProcess:
    proc = SandboxProcess(spec_shape(scratch, uid, ["/bin/sh", "-c", daemon_script(marker)]))
    await proc.start()
    for _ in range(300):
        if live_pids(marker=marker):
            return proc
        await asyncio.sleep(0.02)
    await proc.kill()
    raise AssertionError(f"the daemon never started: {proc.stdout.text()} {proc.stderr.text()}")


async def _gone(marker: str, uid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while live_pids(marker=marker, uids=range(uid, uid + 1)) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return live_pids(marker=marker, uids=range(uid, uid + 1)) == []


async def test_kill_takes_down_daemonized_children(shape: Shape, scratch: Path, uid: int) -> None:
    marker = f"floe-leak-{secrets.token_hex(4)}"
    proc = await _started_with_daemon(shape, scratch, uid, marker)
    with pytest.raises(TimeoutError):
        await proc.wait(timeout=0.2)
    await proc.kill()
    assert proc.killed and await proc.wait_gone()
    assert await _gone(marker, uid)
    await proc.kill()  # twice is fine


async def test_a_sandbox_takes_itself_down_when_its_lifeline_is_cut(shape: Shape, scratch: Path, uid: int) -> None:
    # What the launcher's death does to the pipe (the kernel closes the write end), without killing anything
    # ourselves: the launcher's helper must kill the program and its daemon, so nothing waits on them. This is the
    # backstop for the window before bwrap arms --die-with-parent.
    marker = f"floe-orphan-{secrets.token_hex(4)}"
    proc = await _started_with_daemon(shape, scratch, uid, marker)
    try:
        proc.cut_lifeline()
        code = await proc.wait(timeout=15)  # no kill from us: the sandbox ended by itself
        assert code != 0 and not proc.killed
        assert proc.ns_init_pid is not None and await proc.wait_gone(timeout=5)
        assert await _gone(marker, uid)
    finally:
        await proc.kill()


# The launching process: runs the sandbox with run_sync (the scorer's entry point), and with "spawn" freezes the
# sandbox command the moment it is forked (bwrap has not armed --die-with-parent yet), records its pid, and dies.
LAUNCHER = r"""
import os, pickle, signal, sys, threading, time
from pathlib import Path

from sandbox import run_sync

spec = pickle.loads(bytes.fromhex(sys.argv[1]))
moment, pid_file = sys.argv[2], Path(sys.argv[3])


def freeze_and_die() -> None:
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
                while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
                    time.sleep(0.001)
                pid_file.write_text(pid)
                os.kill(me, signal.SIGKILL)


if moment == "spawn":
    threading.Thread(target=freeze_and_die, daemon=True).start()
run_sync(spec, timeout=300)
"""


@pytest.mark.parametrize("moment", ["running", "spawn"])
def test_a_sandbox_dies_with_its_launcher(shape: Shape, scratch: Path, uid: int, moment: str) -> None:
    marker = f"floe-parent-{secrets.token_hex(4)}"
    spec = shape(scratch, uid, ["/bin/sh", "-c", daemon_script(marker)])
    pid_file = scratch / "sandbox.pid"
    argv = [sys.executable, "-c", LAUNCHER, pickle.dumps(spec).hex(), moment, str(pid_file)]
    frozen: tuple[int, ...] = ()
    launcher: subprocess.Popen[bytes] | None = None
    ours = functools.partial(live_pids, marker=marker, uids=range(uid, uid + 1))
    try:
        for _attempt in range(5):
            # TMPDIR: the private run directory a killed launcher cannot remove lands in scratch, removed with it
            env = {**os.environ, "TMPDIR": str(scratch)}
            launcher = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
            if moment == "running":
                deadline = time.monotonic() + 30
                while not live_pids(marker=marker) and time.monotonic() < deadline and launcher.poll() is None:
                    time.sleep(0.02)
                assert live_pids(marker=marker), launcher.communicate()[0].decode()[-2000:]
                launcher.kill()
            out, _ = launcher.communicate(timeout=60)
            if moment == "spawn" and launcher.returncode == 3 and b"missed the window" in out:
                _kill(ours())  # a scheduling miss is no verdict: again
                continue
            break
        else:
            pytest.fail("the watcher never froze the sandbox command before bwrap ran")
        assert launcher.returncode == -signal.SIGKILL, out.decode()[-2000:]
        if moment == "spawn":
            frozen = (int(pid_file.read_text()),)
            os.kill(frozen[0], signal.SIGCONT)  # go on, as a slow exec would have, with its launcher dead
        deadline = time.monotonic() + 10
        while ours(pids=frozen) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ours(pids=frozen) == [], "the sandbox outlived its launcher"
    finally:
        if launcher is not None and launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        _kill(ours(pids=frozen))  # only what this test started


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_a_namespace_init_bwrap_never_released_dies_with_the_lifeline(shape: Shape, scratch: Path, uid: int) -> None:
    # The state a caller SIGKILLed in the middle of a sandbox start left behind in CI: bwrap, killed with its parent
    # (--die-with-parent) after cloning the namespace's init and before releasing it, leaves that init blocked on
    # bwrap's eventfd for good (no parent-death signal armed yet, reparented to the host's init, no launcher running
    # to watch the lifeline). Made deterministic here: bwrap reports the init's pid into --info-fd before it releases
    # it, so a full pipe there holds bwrap exactly in that window; then bwrap is killed, as the caller's death would.
    spec = shape(scratch, uid, ["/bin/sleep", "600"], seccomp=False)
    spec = dataclasses.replace(spec, limits=dataclasses.replace(spec.limits, pids=64))
    try:
        cg = Cgroup.create(memory_bytes=None, pids=64)
    except CgroupUnavailable as exc:
        pytest.fail(f"this test needs the pids cgroup controller: {exc}")
    run_dir = SandboxProcess(spec)._run_dir()
    info_r, info_w = os.pipe()
    os.set_blocking(info_w, False)
    with contextlib.suppress(BlockingIOError):
        while True:
            os.write(info_w, b"x" * 65536)
    os.set_blocking(info_w, True)  # bwrap's write of the init's pid now blocks
    life_r, life_w = os.pipe()
    # at a two-digit fd, as in a service (a shell's <&N takes one digit: the watcher must not rely on it)
    high = fcntl.fcntl(life_r, fcntl.F_DUPFD_CLOEXEC, 40)
    os.close(life_r)
    life_r = high
    cmd = build_command(spec, run_dir, pinned={}, lifeline_fd=life_r, info_fd=info_w, cgroup=cg)
    bwrap = subprocess.Popen(
        cmd, pass_fds=[info_w, life_r], start_new_session=True, env=dict(spec.env), cwd="/",
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    os.close(life_r)
    os.close(info_w)
    init: int | None = None
    try:
        deadline = time.monotonic() + 10
        while init is None and time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                if _is_bwrap(bwrap.pid):
                    # its children: the cgroup's watcher (forked before the exec) and, once cloned, the init
                    children = Path(f"/proc/{bwrap.pid}/task/{bwrap.pid}/children").read_text().split()
                    init = next((int(c) for c in children if _is_bwrap(int(c))), None)
            time.sleep(0.01)
        assert init is not None, "bwrap never cloned the namespace's init"
        bwrap.kill()
        bwrap.wait()
        time.sleep(0.5)
        # the stuck state itself: the init is alive, still bwrap, never ran the launcher (no children)
        assert _running(init) and _is_bwrap(init)
        assert Path(f"/proc/{init}/task/{init}/children").read_text().split() == []
        os.close(life_w)  # what the caller's death does
        life_w = -1
        deadline = time.monotonic() + 5
        while _running(init) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(init), "the unreleased namespace init outlived the lifeline"
        assert (cg.pids_dir / "cgroup.procs").read_text().split() == []  # type: ignore[operator]
    finally:
        if life_w >= 0:
            os.close(life_w)
        os.close(info_r)
        if init is not None:
            _kill([init])
        deadline = time.monotonic() + 5
        while not cg.remove() and time.monotonic() < deadline:
            time.sleep(0.05)
        shutil.rmtree(run_dir, ignore_errors=True)


def _is_bwrap(pid: int) -> bool:
    try:
        return os.path.basename(Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]) == b"bwrap"
    except OSError:
        return False


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie waits for the host's init to reap it, and holds nothing)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
