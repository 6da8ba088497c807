"""Run a command as an unprivileged user inside a bubblewrap sandbox, and always kill its whole process tree.

What the sandbox gives a harness:
- its own user (``agent_uid``, no passwd entry on the host; a two-line /etc/passwd inside), and ``no_new_privs``;
- read-only ``/usr`` and ``/etc``, the harness install (read-only, same path as on the node), a private HOME and
  the task workspace (both writable), a size-capped ``/tmp``; ``/work``, ``/root``, ``/home``, ``/var``,
  ``/run`` and every other session are simply not there;
- new user, pid, ipc, uts, cgroup and network namespaces: with ``network="none"`` only loopback exists, and the
  launcher forwards ``127.0.0.1:<port>`` to the session's gateway socket (``bridge.py``);
- rlimits set by ``prlimit`` before the uid drop: open files, processes, file size, no core dumps, optionally
  address space.

Killing: bwrap runs in its own process group with ``--die-with-parent``; the sandboxed processes live in a pid
namespace whose init is bwrap's child, so SIGKILL to the group tears the namespace down and the kernel kills every
process in it, however the harness daemonised. ``wait_gone`` then checks the namespace init really left.

Lifeline: ``--die-with-parent`` has a window. bwrap arms it only once it runs, and its namespace init re-arms it
after a credential switch. If the node dies, or cancels a start, inside that window, the init survives. It then
waits forever on whatever the harness left behind; `tests/e2e` caught one such sandbox after a node shutdown. So the
node also holds the write end of a pipe whose read end goes into the sandbox. The launcher's helper process kills
every process of the sandbox when that pipe reaches EOF: the node closed it, or the kernel did because the node
died. There is no window, because the pipe exists before the fork.

Not covered (honest limits): no seccomp filter, no cgroup memory/CPU limits (rlimits only), and the read-only
``/etc`` is the host's. This is an isolation boundary for well-meaning but sloppy agents, not a hardened jail.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from sessions.settings import SessionSettings

__all__ = ["SandboxError", "SandboxProcess", "SandboxResult", "SandboxSpec", "TailBuffer", "run_collect"]

INIT_SCRIPT = Path(__file__).with_name("sandbox_init.py")
RUN_MOUNT = "/run/floe"


class SandboxError(RuntimeError):
    """The sandbox could not be built or started (an infrastructure failure, not the harness's)."""


class TailBuffer:
    """Keeps the last ``limit`` bytes written, and how many were written in all (flood-proof capture)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._buf = bytearray()
        self.total = 0

    def write(self, data: bytes) -> None:
        self.total += len(data)
        self._buf += data
        if len(self._buf) > 2 * self.limit:
            del self._buf[: len(self._buf) - self.limit]

    def text(self) -> str:
        return bytes(self._buf[-self.limit :]).decode("utf-8", errors="replace")


@dataclass(frozen=True)
class SandboxSpec:
    argv: list[str]
    workspace: Path
    home: Path
    run_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    path_prepend: list[str] = field(default_factory=list)
    network: Literal["none", "host"] = "none"
    bridge_socket: Path | None = None  # inside run_dir; only with network="none"


@dataclass
class SandboxResult:
    exit_code: int | None
    stdout: str
    stderr: str
    stdout_bytes: int
    stderr_bytes: int
    killed: bool
    duration_ms: float


def _system_binds() -> list[str]:
    args: list[str] = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        path = Path(top)
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), top]
        elif path.is_dir():
            args += ["--ro-bind", top, top]
    return args


def _write_identity(settings: SessionSettings, run_dir: Path) -> None:
    # A passwd entry for the sandbox uid: node (os.userInfo), Codex (getpwuid) and git ask who they are.
    uid, gid, home = settings.agent_uid, settings.agent_gid, settings.sandbox_home
    (run_dir / "passwd").write_text(f"root:x:0:0::/:/usr/sbin/nologin\nagent:x:{uid}:{gid}:agent:{home}:/bin/sh\n")
    (run_dir / "group").write_text(f"root:x:0:\nagent:x:{gid}:\n")
    for name in ("passwd", "group"):
        os.chmod(run_dir / name, 0o644)
    if not (run_dir / INIT_SCRIPT.name).exists():
        shutil.copyfile(INIT_SCRIPT, run_dir / INIT_SCRIPT.name)
        os.chmod(run_dir / INIT_SCRIPT.name, 0o644)


def build_command(
    settings: SessionSettings, spec: SandboxSpec, harness_fd: int | None, lifeline_fd: int | None = None
) -> list[str]:
    """The full argv: prlimit -> setpriv (drop to the agent uid) -> bwrap -> launcher -> harness."""
    limits = [
        f"--nofile={settings.rlimit_nofile}",
        f"--nproc={settings.rlimit_nproc}",
        f"--fsize={settings.rlimit_fsize_mb * 1024 * 1024}",
        "--core=0",
    ]
    if settings.rlimit_as_mb is not None:
        limits.append(f"--as={settings.rlimit_as_mb * 1024 * 1024}")
    cmd = ["prlimit", *limits, "--"]
    cmd += [
        "setpriv",
        f"--reuid={settings.agent_uid}",
        f"--regid={settings.agent_gid}",
        "--clear-groups",
        "--no-new-privs",
        "--",
    ]
    cmd += ["bwrap", "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session", "--disable-userns"]
    if spec.network == "host":
        cmd.append("--share-net")
    cmd += _system_binds()
    cmd += ["--ro-bind", "/etc", "/etc"]
    cmd += ["--ro-bind", str(spec.run_dir / "passwd"), "/etc/passwd"]
    cmd += ["--ro-bind", str(spec.run_dir / "group"), "/etc/group"]
    cmd += ["--proc", "/proc", "--dev", "/dev"]
    cmd += ["--size", str(settings.tmp_size_mb * 1024 * 1024), "--tmpfs", "/tmp"]
    if harness_fd is not None:
        # Same path as on the node: venv shebangs and npm's absolute links keep working. The fd pins the directory
        # we checked; bwrap (running as the agent uid) still resolves the path, hence _traversable().
        cmd += ["--ro-bind-fd", str(harness_fd), str(settings.harness_home)]
    cmd += ["--bind", str(spec.home), settings.sandbox_home]
    cmd += ["--bind", str(spec.workspace), settings.sandbox_workspace]
    cmd += ["--ro-bind", str(spec.run_dir), RUN_MOUNT]
    cmd += ["--chdir", settings.sandbox_workspace]
    launcher = [str(settings.bridge_python), f"{RUN_MOUNT}/{INIT_SCRIPT.name}"]
    if lifeline_fd is not None:
        launcher += ["--lifeline", str(lifeline_fd)]
    if spec.bridge_socket is not None:
        launcher += ["--bridge", str(settings.inner_gateway_port), f"{RUN_MOUNT}/{spec.bridge_socket.name}"]
    return [*cmd, "--", *launcher, "--", *spec.argv]


def sandbox_env(settings: SessionSettings, spec: SandboxSpec) -> dict[str, str]:
    path = [*spec.path_prepend, "/usr/local/bin", "/usr/bin", "/bin", "/usr/local/sbin", "/usr/sbin", "/sbin"]
    env = {
        "HOME": settings.sandbox_home,
        "USER": "agent",
        "LOGNAME": "agent",
        "SHELL": "/bin/sh",
        "PATH": ":".join(path),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "TMPDIR": "/tmp",
        "NO_COLOR": "1",
        "CI": "1",
    }
    env.update(spec.env)
    return env


def find_cli(cli: str, path_prepend: list[str]) -> str | None:
    """Where ``cli`` resolves on the sandbox PATH (the harness install keeps its node path, /usr is shared)."""
    if "/" in cli:
        return cli if os.access(cli, os.X_OK) else None
    for directory in [*path_prepend, "/usr/local/bin", "/usr/bin", "/bin"]:
        candidate = Path(directory) / cli
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


class SandboxProcess:
    """One sandboxed process: start it, stream its output into tails, wait with a deadline, kill the tree."""

    def __init__(self, settings: SessionSettings, spec: SandboxSpec) -> None:
        self.settings = settings
        self.spec = spec
        self.stdout = TailBuffer(settings.output_tail_bytes)
        self.stderr = TailBuffer(settings.output_tail_bytes)
        self._proc: asyncio.subprocess.Process | None = None
        self._readers: list[asyncio.Task[None]] = []
        self._info_read: int | None = None
        self._lifeline: int | None = None  # write end; closing it (or dying) makes the sandbox kill itself
        self.ns_init_pid: int | None = None
        self.killed = False
        self._started = 0.0
        self.full_stdout: bytearray | None = None  # run_collect keeps all of stdout, up to full_stdout_cap
        self.full_stdout_cap = 0
        self.full_stdout_overflow = False

    async def start(self) -> None:
        _write_identity(self.settings, self.spec.run_dir)
        harness_fd: int | None = None
        if self.settings.harness_home.is_dir():
            harness_fd = os.open(self.settings.harness_home, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            if not _traversable(self.settings.harness_home):
                os.close(harness_fd)
                raise SandboxError(
                    f"harness home {self.settings.harness_home} is not reachable by the sandbox uid (a parent "
                    "directory is not world-executable); install with FLOE_CACHE=/var/cache/floe"
                )
        info_r, info_w = os.pipe()
        life_r, life_w = os.pipe()  # both close-on-exec: only the read end is passed (pass_fds), never the write end
        try:
            cmd = build_command(self.settings, self.spec, harness_fd, life_r)
            bw = cmd.index("bwrap")
            cmd[bw + 1 : bw + 1] = ["--info-fd", str(info_w)]
            fds = [info_w, life_r] + ([harness_fd] if harness_fd is not None else [])
            self._started = time.monotonic()
            self._proc = await asyncio.create_subprocess_exec(
                *cmd,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=sandbox_env(self.settings, self.spec),
                start_new_session=True,
                pass_fds=fds,
                cwd="/",
            )
        except BaseException as exc:
            # Including a cancellation in the middle of the spawn: whatever started sees EOF and ends itself.
            os.close(life_w)
            os.close(info_r)
            if isinstance(exc, OSError):
                raise SandboxError(f"cannot start bwrap: {exc}") from exc
            raise
        finally:
            os.close(info_w)
            os.close(life_r)
            if harness_fd is not None:
                os.close(harness_fd)
        self._lifeline = life_w
        self._info_read = info_r
        assert self._proc.stdout is not None and self._proc.stderr is not None
        self._readers = [
            asyncio.create_task(self._drain(self._proc.stdout, self.stdout, keep_all=self.full_stdout is not None)),
            asyncio.create_task(self._drain(self._proc.stderr, self.stderr, keep_all=False)),
        ]
        self.ns_init_pid = await asyncio.to_thread(_read_child_pid, info_r)
        self._info_read = None

    async def _drain(self, stream: asyncio.StreamReader, tail: TailBuffer, *, keep_all: bool) -> None:
        while chunk := await stream.read(65536):
            tail.write(chunk)
            if keep_all and self.full_stdout is not None:
                if len(self.full_stdout) + len(chunk) > self.full_stdout_cap:
                    self.full_stdout_overflow = True
                else:
                    self.full_stdout += chunk

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    async def wait(self, timeout: float | None = None) -> int:
        """Exit code of the sandbox (the harness's); raises ``TimeoutError`` after ``timeout`` s (still running)."""
        assert self._proc is not None
        code = await asyncio.wait_for(self._proc.wait(), timeout=timeout)
        await asyncio.wait_for(asyncio.gather(*self._readers, return_exceptions=True), timeout=5.0)
        self._cut_lifeline()
        return code

    def _cut_lifeline(self) -> None:
        if self._lifeline is not None:
            os.close(self._lifeline)
            self._lifeline = None

    async def kill(self) -> None:
        """SIGKILL the whole tree; return once the sandbox's pid namespace is gone. Safe to call twice."""
        self._cut_lifeline()
        proc = self._proc
        if proc is None:
            return
        if proc.returncode is None:
            self.killed = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), timeout=10.0)
        for task in self._readers:
            if not task.done():
                task.cancel()
        await asyncio.gather(*self._readers, return_exceptions=True)
        await self.wait_gone()

    async def wait_gone(self, timeout: float = 5.0) -> bool:
        """True once the pid namespace's init (and so every process in it) has exited."""
        pid = self.ns_init_pid
        if pid is None:
            return True
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not _alive(pid):
                return True
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            await asyncio.sleep(0.02)
        return False

    def result(self, exit_code: int | None) -> SandboxResult:
        return SandboxResult(
            exit_code=exit_code,
            stdout=self.stdout.text(),
            stderr=self.stderr.text(),
            stdout_bytes=self.stdout.total,
            stderr_bytes=self.stderr.total,
            killed=self.killed,
            duration_ms=(time.monotonic() - self._started) * 1000.0,
        )


def _read_child_pid(fd: int) -> int | None:
    # bwrap writes {"child-pid": N, ...} once the namespace exists, then closes the fd; EOF without it means
    # bwrap failed before (its stderr says why).
    with os.fdopen(fd, "rb") as f:
        data = f.read()
    if not data:
        return None
    try:
        return int(json.loads(data.decode())["child-pid"])
    except (ValueError, KeyError):
        return None


def _traversable(path: Path) -> bool:
    for parent in [path, *path.parents]:
        try:
            if not parent.stat().st_mode & 0o001:
                return False
        except OSError:
            return False
    return True


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        return state != b"Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


async def run_collect(
    settings: SessionSettings, spec: SandboxSpec, *, timeout: float, max_stdout: int
) -> tuple[int, bytes, str]:
    """Run a short command in the sandbox and return (exit code, all of stdout, stderr tail). Used for prepare
    steps and diff collection. Raises ``SandboxError`` when stdout exceeds ``max_stdout`` or on timeout."""
    proc = SandboxProcess(settings, spec)
    proc.full_stdout = bytearray()
    proc.full_stdout_cap = max_stdout
    await proc.start()
    try:
        code = await proc.wait(timeout=timeout)
    except TimeoutError as exc:
        raise SandboxError(f"{spec.argv[0]} timed out after {timeout:.0f}s") from exc
    finally:
        await proc.kill()
    if proc.full_stdout_overflow:
        raise SandboxError(f"output of {spec.argv[0]} exceeds {max_stdout} bytes")
    return code, bytes(proc.full_stdout), proc.stderr.text()
