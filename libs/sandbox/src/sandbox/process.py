"""Start one sandboxed command, capture its output, wait with a deadline, and always kill its whole process tree.

Killing: the command line (``sandbox.command``) runs in its own process group, and bwrap has ``--die-with-parent``.
The sandboxed processes live in a pid namespace whose init is bwrap's child, so SIGKILL to the group tears the
namespace down and the kernel kills every process in it, however the program daemonised. ``wait_gone`` then checks
that the namespace's init really left (held by a pidfd, so a reused pid is never signalled).

Lifeline: ``--die-with-parent`` has a window. bwrap arms it only once it runs, and its namespace init re-arms it
after a credential switch; a parent that dies, or cancels a start, inside that window leaves a sandbox that runs
until its program ends, unwatched. So the caller also holds the write end of a pipe whose read end goes into the
sandbox. The launcher's helper (``sandbox_init.sh``, or ``sandbox_init.py`` with a bridge) kills every process of
the sandbox when that pipe reaches EOF: the caller cut it (``wait``/``kill``), or the kernel did because the caller
died. There is no window: the pipe
exists before the fork, and nobody else holds the write end (close-on-exec, and never in ``pass_fds``).

Hardening and limits: the seccomp program (``sandbox.seccomp``) goes to bwrap in a memfd, like the info fd. With
``Limits.memory_bytes`` or ``Limits.pids`` the sandbox gets a cgroup of its own (``sandbox.cgroup``), created before
the spawn and joined by the first process of the command chain; ``kill`` reads which of its limits fired and removes
it. Where cgroups are not available the sandbox runs with its rlimits only, and ``SandboxResult.cgroup_missing``
says why. ``SandboxResult.limit`` names the limit that fired: a cgroup's (memory, pids), an rlimit recognised by the
exit status (SIGXCPU, SIGXFSZ), or the wall clock.

``run`` is start -> wait(timeout) -> kill in one call; ``run_sync`` is the same for threads without a loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import select
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from sandbox import seccomp
from sandbox.bridge import UnixBridge
from sandbox.capture import Capture
from sandbox.cgroup import Cgroup, CgroupUnavailable
from sandbox.command import LAUNCHERS, build_command
from sandbox.spec import Bind, LimitHit, SandboxError, SandboxSpec

__all__ = ["SandboxProcess", "SandboxResult", "run", "run_sync"]


@dataclass(frozen=True)
class SandboxResult:
    """What a sandboxed command left: exit code (bwrap reports the program's, 128+N for a signal; negative when
    bwrap itself was killed), the kept output (``Capture.data``), how much was written, and why it ended."""

    exit_code: int | None
    stdout: bytes
    stderr: bytes  # empty when stderr was merged into stdout
    stdout_total: int
    stderr_total: int
    stdout_overflowed: bool
    killed: bool  # we SIGKILLed it (timeout, cancellation, or kill() while it ran)
    timed_out: bool
    duration_s: float
    # The limits that fired, most telling first: cgroup memory (an OOM kill), cgroup pids (a refused fork), the CPU
    # and file-size rlimits (recognised by the exit status, 128+SIGXCPU / 128+SIGXFSZ), the wall clock.
    limits_hit: tuple[LimitHit, ...] = ()
    cgroup: str | None = None  # the cgroup limits in force ("v1 memory.limit_in_bytes=... pids.max=..."), if any
    cgroup_missing: str | None = None  # why the cgroup limits asked for are not in force
    seccomp: bool = False  # the seccomp filter was handed to bwrap (it refuses to start without installing it)

    @property
    def limit(self) -> str | None:
        """The limit that fired (``"memory (cgroup memory.limit_in_bytes=67108864)"``), or None."""
        return str(self.limits_hit[0]) if self.limits_hit else None

    @property
    def stdout_text(self) -> str:
        return self.stdout.decode("utf-8", errors="replace")

    @property
    def stderr_text(self) -> str:
        return self.stderr.decode("utf-8", errors="replace")


class SandboxProcess:
    """One sandboxed command: ``start``, ``wait`` (with a deadline), ``kill`` (idempotent, always call it)."""

    def __init__(self, spec: SandboxSpec) -> None:
        self.spec = spec
        self.stdout = Capture(spec.stdout.head, spec.stdout.tail)
        self.stderr = Capture(spec.stderr.head, spec.stderr.tail) if spec.stderr is not None else Capture(0, 0)
        self.bridge: UnixBridge | None = None
        self.ns_init_pid: int | None = None
        self.killed = False
        self._proc: asyncio.subprocess.Process | None = None
        self._readers: list[asyncio.Task[None]] = []
        self._lifeline: int | None = None  # write end; closing it (or dying) makes the sandbox kill itself
        self._ns_init_fd: int | None = None  # pidfd of the namespace's init
        self._own_run_dir: Path | None = None
        self._started = 0.0
        self._ended: float | None = None
        self.cgroup: Cgroup | None = None
        self.cgroup_missing: str | None = None
        self._cgroup_desc: str | None = None
        self._cgroup_hits: list[LimitHit] = []

    # ------------------------------------------------------------------------------------------------ start

    async def start(self) -> None:
        """Spawn the sandbox; return once its pid namespace exists (``ns_init_pid``; ``None`` if bwrap failed, its
        stderr says why). Raises ``SandboxError`` and leaves nothing behind when it cannot be started."""
        spec = self.spec
        if spec.uid is None and os.geteuid() == 0:
            raise SandboxError("refusing to run a sandbox as root: give the spec an unprivileged uid")
        pinned: dict[Bind, int] = {}
        fds: list[int] = []
        try:
            run_dir = self._run_dir()
            for mount in spec.mounts:
                if isinstance(mount, Bind) and mount.pin:
                    pinned[mount] = _pin(mount, check_others=spec.uid is not None and spec.uid != os.geteuid())
            if spec.bridge is not None:
                self.bridge = UnixBridge(run_dir / spec.bridge.socket_name, *spec.bridge.upstream)
                await self.bridge.start()
            # bwrap reports its namespace's init into a file, not a pipe: a pipe whose reader (we) died would kill
            # bwrap with SIGPIPE right after its clone, before it releases the child, which then waits forever.
            info = os.memfd_create("floe-bwrap-info", os.MFD_CLOEXEC)
            fds.append(info)
            passed = [info]
            filter_fd: int | None = None
            if spec.seccomp:
                # A memfd of its own per sandbox: bwrap reads it from the current offset to EOF, and the offset is
                # shared by every holder of the file description.
                program = seccomp.program()
                filter_fd = os.memfd_create("floe-seccomp", os.MFD_CLOEXEC)
                fds.append(filter_fd)
                os.write(filter_fd, program)
                os.lseek(filter_fd, 0, os.SEEK_SET)
                passed.append(filter_fd)
            self._make_cgroup()
            life_r, life_w = os.pipe()  # both close-on-exec: only the read end is passed (pass_fds), never the write
            fds += [life_r, life_w]
            cmd = build_command(
                spec,
                run_dir,
                pinned=pinned,
                lifeline_fd=life_r,
                info_fd=info,
                seccomp_fd=filter_fd,
                cgroup=self.cgroup,
            )
            self._started = time.monotonic()
            self._proc = await asyncio.create_subprocess_exec(
                *cmd,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE if spec.stderr is not None else asyncio.subprocess.STDOUT,
                env=dict(spec.env),
                start_new_session=True,
                pass_fds=[*passed, life_r, *pinned.values()],
                cwd="/",
            )
        except BaseException as exc:
            # Including a cancellation in the middle of the spawn: whatever started sees EOF and ends itself.
            for fd in fds:
                os.close(fd)
            await self._release()
            if isinstance(exc, OSError):
                raise SandboxError(f"cannot start the sandbox: {exc}") from exc
            raise
        finally:
            for fd in pinned.values():
                os.close(fd)
        os.close(life_r)
        if filter_fd is not None:
            os.close(filter_fd)  # bwrap has its own copy
        self._lifeline = life_w
        streams = [(self._proc.stdout, self.stdout), (self._proc.stderr, self.stderr)]
        self._readers = [asyncio.create_task(_drain(s, c)) for s, c in streams if s is not None]
        try:
            self.ns_init_pid = await self._read_ns_init(info)
        finally:
            os.close(info)
        if self.ns_init_pid is not None:
            with contextlib.suppress(OSError):  # already gone: wait_gone has nothing to wait for
                self._ns_init_fd = os.pidfd_open(self.ns_init_pid)

    def _make_cgroup(self) -> None:
        lim = self.spec.limits
        if lim.memory_bytes is None and lim.pids is None:
            return
        try:
            self.cgroup = Cgroup.create(memory_bytes=lim.memory_bytes, pids=lim.pids)
            self._cgroup_desc = self.cgroup.describe()
        except CgroupUnavailable as exc:
            # Not an error: the rlimits still hold, and the result says the cgroup limits did not.
            self.cgroup_missing = str(exc)

    async def _read_ns_init(self, info: int) -> int | None:
        # bwrap writes {"child-pid": N, ...}\n once the namespace exists; exiting without it means bwrap failed
        # before (its stderr says why).
        assert self._proc is not None
        # bwrap takes a few ms to get there: poll finely at first (a memfd cannot be waited on), then back off.
        pause = 0.0005
        while True:
            exited = self._proc.returncode is not None
            data = os.pread(info, 65536, 0)
            if data.rstrip().endswith(b"}"):
                try:
                    return int(json.loads(data.decode())["child-pid"])
                except (ValueError, KeyError):
                    return None
            if exited:
                return None
            await asyncio.sleep(pause)
            pause = min(pause * 1.5, 0.02)

    def _run_dir(self) -> Path:
        spec = self.spec
        if spec.run_dir is None:
            self._own_run_dir = Path(tempfile.mkdtemp(prefix="floe-sandbox-"))
            run_dir = self._own_run_dir
        else:
            run_dir = spec.run_dir
        # bwrap resolves bind sources as the sandbox uid, and the launcher reads its script as that uid.
        os.chmod(run_dir, 0o755)
        files = {launcher.name: launcher.read_text() for launcher in LAUNCHERS}
        if spec.identity is not None:
            ident, uid, gid = spec.identity, spec.uid if spec.uid is not None else os.geteuid(), spec.gid
            gid = gid if gid is not None else os.getegid()
            files["passwd"] = (
                f"root:x:0:0::/:/usr/sbin/nologin\n{ident.user}:x:{uid}:{gid}:{ident.user}:{ident.home}:{ident.shell}\n"
            )
            files["group"] = f"root:x:0:\n{ident.user}:x:{gid}:\n"
        for name, text in files.items():
            # Atomically: another sandbox may be starting from the same run directory.
            tmp = run_dir / f".{name}.{os.getpid()}.{id(self)}"
            tmp.write_text(text)
            os.chmod(tmp, 0o644)
            os.replace(tmp, run_dir / name)
        return run_dir

    # ------------------------------------------------------------------------------------------------- wait

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode if self._proc is not None else None

    async def wait(self, timeout: float | None = None) -> int:
        """Exit code of the sandbox (its program's); raises ``TimeoutError`` after ``timeout`` s (still running)."""
        assert self._proc is not None, "start() first"
        code = await asyncio.wait_for(self._proc.wait(), timeout=timeout)
        self._ended = time.monotonic()
        # Cut before draining: nothing of the sandbox outlives bwrap's pid namespace, but the cgroup watcher (outside
        # it, waiting on the lifeline) may hold a copy of the output's write end where the loop's spawn leaves one open
        # (uvloop: libuv keeps its stdio socketpair ends beside fds 1 and 2), and the readers would wait for it. What
        # the program wrote is already buffered; the readers still drain it.
        self.cut_lifeline()
        await asyncio.wait_for(asyncio.gather(*self._readers, return_exceptions=True), timeout=5.0)
        return code

    def cut_lifeline(self) -> None:
        """Close our end of the lifeline: the sandbox kills everything in it (what our death would do)."""
        if self._lifeline is not None:
            os.close(self._lifeline)
            self._lifeline = None

    # ------------------------------------------------------------------------------------------------- kill

    async def kill(self) -> None:
        """SIGKILL the whole tree, return once the pid namespace is gone, and release what the launcher made (the
        bridge, a temporary run directory). Safe to call twice, and after a failed ``start``."""
        proc = self._proc
        running = proc is not None and proc.returncode is None
        if proc is not None and running:
            # SIGKILL before the lifeline is cut: cut first, the launcher's helper could end the program a moment
            # earlier and bwrap would exit 137 ("its program was killed") instead of dying of our signal (-9).
            self.killed = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        self.cut_lifeline()
        if proc is not None:
            if running:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(proc.wait(), timeout=10.0)
            if self._ended is None:
                self._ended = time.monotonic()
            # What was written before the kill is still in the pipes: read it to EOF (the namespace's death closes
            # every write end), but never wait on a writer that somehow survived.
            if self._readers:
                await asyncio.wait(self._readers, timeout=2.0)
            for task in self._readers:
                if not task.done():
                    task.cancel()
            await asyncio.gather(*self._readers, return_exceptions=True)
            await self.wait_gone()
        await self._release()

    async def wait_gone(self, timeout: float = 5.0) -> bool:
        """True once the pid namespace's init (and so every process in it) has exited."""
        fd = self._ns_init_fd
        if fd is None:
            return True
        if not _exited(fd):
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            # Woken by the pidfd itself (readable once the process exits), not by polling: the namespace's init
            # usually leaves a moment after bwrap, and a 20 ms poll cost more than a short sandbox runs.
            if not await _readable(fd, timeout):
                return False
        os.close(fd)
        self._ns_init_fd = None
        return True

    async def _release(self) -> None:
        if self.bridge is not None:
            with contextlib.suppress(Exception):
                await self.bridge.close()
        if self.cgroup is not None:
            cg, self.cgroup = self.cgroup, None
            self._cgroup_hits = cg.hits()  # before the removal takes the counters with it
            # rmdir answers EBUSY until the last exiting process has left: retry briefly (remove() SIGKILLs anything
            # still inside; normally nothing is, the pid namespace is gone).
            pause = 0.001
            deadline = time.monotonic() + 5.0
            while not cg.remove() and time.monotonic() < deadline:
                await asyncio.sleep(pause)
                pause = min(pause * 2, 0.1)
        if self._own_run_dir is not None:
            await asyncio.to_thread(shutil.rmtree, self._own_run_dir, True)
            self._own_run_dir = None

    def result(
        self, exit_code: int | None = None, *, timed_out: bool = False, timeout_s: float | None = None
    ) -> SandboxResult:
        """The outcome so far; ``exit_code`` defaults to the sandbox's own (``None`` while it runs). ``timed_out``:
        the caller's wall clock (of ``timeout_s`` seconds) ended it. The cgroup's limits are known after ``kill``."""
        ended = self._ended if self._ended is not None else time.monotonic()
        code = exit_code if exit_code is not None else self.returncode
        lim = self.spec.limits
        hits = list(self._cgroup_hits)
        # bwrap exits 128+N when its program died of signal N; these two are the kernel enforcing an rlimit.
        if code == 128 + signal.SIGXCPU and lim.cpu_s is not None:
            hits.append(LimitHit("cpu", "RLIMIT_CPU", lim.cpu_s))
        if code == 128 + signal.SIGXFSZ:
            hits.append(LimitHit("file-size", "RLIMIT_FSIZE", lim.fsize_bytes))
        if timed_out:
            wall = timeout_s if timeout_s is not None else ended - self._started
            hits.append(LimitHit("wall-clock", "timeout", wall))
        return SandboxResult(
            exit_code=code,
            stdout=self.stdout.data(),
            stderr=self.stderr.data(),
            stdout_total=self.stdout.total,
            stderr_total=self.stderr.total,
            stdout_overflowed=self.stdout.overflowed,
            killed=self.killed,
            timed_out=timed_out,
            duration_s=ended - self._started if self._started else 0.0,
            limits_hit=tuple(hits),
            cgroup=self._cgroup_desc,
            cgroup_missing=self.cgroup_missing,
            seccomp=self.spec.seccomp and self._started > 0,
        )


async def run(spec: SandboxSpec, *, timeout: float) -> SandboxResult:
    """Run ``spec`` to its end or ``timeout`` seconds of wall clock, whichever comes first; nothing survives it.
    Raises ``SandboxError`` only when it cannot be started."""
    proc = SandboxProcess(spec)
    timed_out = False
    try:
        # The deadline covers the start too: a bwrap that never gets its namespace up is killed like any other.
        async with asyncio.timeout(timeout):
            await proc.start()
            await proc.wait()
    except TimeoutError:
        timed_out = True
    finally:
        await proc.kill()
    return proc.result(timed_out=timed_out, timeout_s=timeout)


def run_sync(spec: SandboxSpec, *, timeout: float) -> SandboxResult:
    """``run`` for synchronous callers (the scorer's grading threads). From inside a running event loop it runs on
    a thread of its own, since the loop's thread is blocked either way."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(run(spec, timeout=timeout))
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sandbox") as pool:
        return pool.submit(lambda: asyncio.run(run(spec, timeout=timeout))).result()


async def _drain(stream: asyncio.StreamReader, capture: Capture) -> None:
    while chunk := await stream.read(65536):
        capture.write(chunk)


def _pin(bind: Bind, *, check_others: bool) -> int:
    try:
        fd = os.open(bind.source, os.O_PATH | os.O_CLOEXEC)
    except OSError as exc:
        raise SandboxError(f"cannot open {bind.source} to bind it at {bind.dest}: {exc}") from exc
    if check_others and not _traversable(bind.source):
        os.close(fd)
        raise SandboxError(
            f"{bind.source} is not reachable by the sandbox uid (a parent directory is not world-executable)"
        )
    return fd


def _traversable(path: Path) -> bool:
    for parent in [path, *path.parents]:
        try:
            if not parent.stat().st_mode & 0o001:
                return False
        except OSError:
            return False
    return True


async def _readable(fd: int, timeout: float) -> bool:
    """Wait until ``fd`` polls readable (a pidfd: its process exited); False after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await asyncio.wait_for(ready, timeout)
        return True
    except TimeoutError:
        return _exited(fd)
    finally:
        loop.remove_reader(fd)


def _exited(pidfd: int) -> bool:
    # A pidfd polls readable once its process has exited.
    return bool(select.select([pidfd], [], [], 0)[0])
