"""The sandbox command line: [cgroup join] -> ``prlimit`` -> ``setpriv`` (the uid drop) -> ``bwrap`` (with its
seccomp filter) -> launcher -> the command.

Pure functions of a ``SandboxSpec`` and the file descriptors the process layer opened (``sandbox.process``), so the
recipe can be read, and tested, in one place. Tools are called by absolute path: the chain starts as root, and the
sandbox's ``PATH`` (its environment is the chain's) must not choose what root executes.

The cgroup join (``sandbox.cgroup.join_argv``) is there only when the sandbox has a cgroup: a ``/bin/sh`` that leaves
the cgroup's watcher behind on the lifeline, moves itself into the cgroup and execs the rest, so every process of the
sandbox starts inside. ``--seccomp FD`` names the memfd
holding ``sandbox.seccomp.program()``; bwrap installs it right before it execs the launcher.

Mount order matters (later mounts shadow earlier ones): system mounts, ``/etc`` and the identity files, ``/proc``,
``/dev``, the size-capped ``/tmp``, then the spec's mounts in order, then the run directory at ``RUN_MOUNT``; then
bwrap's root (a tmpfs without a size) is remounted read-only.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from sandbox.cgroup import Cgroup, join_argv
from sandbox.spec import RUN_MOUNT, Bind, SandboxError, SandboxSpec, Tmpfs

__all__ = ["INIT_SCRIPT", "INIT_SHELL", "LAUNCHERS", "NPROC_OVER_PIDS", "build_command", "tool"]

# Two launchers with the same lifeline: the bash one for most sandboxes (about 1 ms to start), the Python one only
# when the sandbox needs its TCP bridge (a listener inside, which sh cannot open; ~20 ms).
INIT_SCRIPT = Path(__file__).with_name("sandbox_init.py")
INIT_SHELL = Path(__file__).with_name("sandbox_init.sh")
LAUNCHERS = (INIT_SCRIPT, INIT_SHELL)


def tool(name: str) -> str:
    """Absolute path of ``name`` on the caller's PATH; ``SandboxError`` when it is missing."""
    found = shutil.which(name)
    if found is None:
        pkg = "bubblewrap" if name == "bwrap" else "util-linux"
        raise SandboxError(f"{name} is not installed (apt-get install {pkg})")
    return found


def _system_mounts() -> list[str]:
    # The host's own layout: on merged-/usr systems /bin, /lib... are links into /usr, elsewhere real directories.
    args: list[str] = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        path = Path(top)
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), top]
        elif path.is_dir():
            args += ["--ro-bind", top, top]
    return args


# RLIMIT_NPROC above a pids cgroup in force by this much. Both count the same processes when the uid is the
# sandbox's own, and at equal values the rlimit refuses first (its check comes earlier in fork) and is named by
# nothing; the cgroup is exact, per sandbox, and says it fired.
NPROC_OVER_PIDS = 16


def _prlimit(spec: SandboxSpec, cgroup: Cgroup | None) -> list[str]:
    lim = spec.limits
    nproc = lim.nproc
    if cgroup is not None and cgroup.pids is not None:
        nproc = max(nproc, cgroup.pids + NPROC_OVER_PIDS)
    args = [tool("prlimit"), f"--nofile={lim.nofile}", f"--nproc={nproc}", f"--fsize={lim.fsize_bytes}", "--core=0"]
    if lim.address_space_bytes is not None:
        args.append(f"--as={lim.address_space_bytes}")
    if lim.cpu_s is not None:
        # soft < hard: at the soft limit the kernel sends SIGXCPU, which names the limit in the exit status (128+24);
        # with soft == hard it sends SIGKILL, which reads like any other kill. The hard limit a second later ends a
        # process that ignores SIGXCPU.
        args.append(f"--cpu={lim.cpu_s}:{lim.cpu_s + 1}")
    return [*args, "--"]


def build_command(
    spec: SandboxSpec,
    run_dir: Path,
    *,
    pinned: dict[Bind, int],
    lifeline_fd: int,
    info_fd: int | None = None,
    seccomp_fd: int | None = None,
    cgroup: Cgroup | None = None,
) -> list[str]:
    """The full argv. ``pinned`` maps each ``Bind(pin=True)`` of the spec to its open fd; ``lifeline_fd`` is the
    read end of the lifeline; ``info_fd`` is where bwrap reports the pid of the namespace's init; ``seccomp_fd``
    holds the compiled filter (required when ``spec.seccomp``); ``cgroup`` is the sandbox's, when it has one."""
    if spec.seccomp and seccomp_fd is None:
        raise ValueError("the spec asks for seccomp: build_command needs the filter's fd")
    cmd = join_argv(cgroup.procs_files, lifeline_fd) if cgroup is not None else []
    cmd += _prlimit(spec, cgroup)
    if spec.uid is not None:
        cmd += [
            tool("setpriv"),
            f"--reuid={spec.uid}",
            f"--regid={spec.gid}",
            "--clear-groups",
            "--no-new-privs",
            "--",
        ]
    # --unshare-user explicitly (not --unshare-all's "try"): --disable-userns needs it, and nested user namespaces
    # are the kernel attack surface a sandboxed program has no use for.
    cmd += [tool("bwrap"), "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session"]
    if info_fd is not None:
        cmd += ["--info-fd", str(info_fd)]
    if spec.seccomp and seccomp_fd is not None:
        cmd += ["--seccomp", str(seccomp_fd)]
    if spec.network == "host":
        cmd.append("--share-net")
    cmd += _system_mounts()
    cmd += ["--ro-bind", "/etc", "/etc"]
    if spec.identity is not None:
        cmd += ["--ro-bind", str(run_dir / "passwd"), "/etc/passwd", "--ro-bind", str(run_dir / "group"), "/etc/group"]
    cmd += ["--proc", "/proc", "--dev", "/dev"]
    cmd += ["--size", str(spec.tmp_bytes), "--tmpfs", "/tmp"]
    for mount in spec.mounts:
        if isinstance(mount, Tmpfs):
            cmd += ["--perms", f"{mount.mode:04o}", "--size", str(mount.size_bytes), "--tmpfs", mount.dest]
        elif mount.pin:
            cmd += ["--ro-bind-fd", str(pinned[mount]), mount.dest]
        else:
            cmd += ["--bind" if mount.writable else "--ro-bind", str(mount.source), mount.dest]
    # Last: bwrap's own root is a tmpfs of no set size, writable by the sandbox uid (its owner inside). Read-only
    # once every mount point in it exists, so writes can only go where the spec put a size or a host directory.
    cmd += ["--ro-bind", str(run_dir), RUN_MOUNT, "--remount-ro", "/", "--chdir", spec.cwd]
    if spec.bridge is None:
        launcher = ["/bin/bash", "-p", f"{RUN_MOUNT}/{INIT_SHELL.name}", str(lifeline_fd)]
        if "SHLVL" not in spec.env:
            launcher.append("--unset-shlvl")
    else:
        # -I: the launcher ignores PYTHON* variables meant for the sandboxed program (a PYTHONPATH into the
        # workspace must not replace the launcher's standard library); -S: no site import, it needs none.
        launcher = [
            str(spec.init_python),
            "-I",
            "-S",
            f"{RUN_MOUNT}/{INIT_SCRIPT.name}",
            "--lifeline",
            str(lifeline_fd),
        ]
        launcher += ["--bridge", str(spec.bridge.port), f"{RUN_MOUNT}/{spec.bridge.socket_name}"]
    return [*cmd, "--", *launcher, "--", *spec.argv]
