"""Attacks on the sandbox, run for real (real bwrap, real kernel, real cgroups): each says what happened, which limit
fired (``SandboxResult.limit``), and that nothing was left behind: no process of the sandbox uid, no cgroup of this
test process under the ``floe`` cgroup directories.

The grading shape, with small limits so that each attack ends in seconds: 64 MiB of memory (no RLIMIT_AS, so the
cgroup is what fires), 32 processes, 8 MiB per file, a 32 MiB ``/testbed`` and a 16 MiB ``/tmp``. The observed
outcomes are in docs/scorer.md ("Sandbox attacks").
"""

from __future__ import annotations

import asyncio
import errno
import os
import platform
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from sandbox import Bind, Limits, SandboxError, SandboxResult, Tmpfs, run
from sandbox import seccomp as sc
from sandbox.cgroup import Cgroup, CgroupUnavailable, parent_dirs, sweep_stale

from .conftest import grading_shaped, live_pids

MIB = 1024**2
LIMITS = Limits(nproc=4096, fsize_bytes=8 * MIB, cpu_s=20, memory_bytes=64 * MIB, pids=32)


def _cgroups_or_skip() -> None:
    try:
        Cgroup.create(memory_bytes=MIB * 64, pids=8).remove()
    except CgroupUnavailable as exc:
        pytest.skip(f"no cgroup limits on this machine: {exc}")


def our_cgroups() -> list[Path]:
    """Sandbox cgroups this test process made and that still exist."""
    return [d for parent in parent_dirs() if parent.is_dir() for d in parent.glob(f"sbx-{os.getpid()}-*")]


async def attack(
    scratch: Path, uid: int, code: str, *, shell: bool = False, timeout: float = 20, **kw: object
) -> SandboxResult:
    argv = ["/bin/bash", "-c", code] if shell else ["/usr/bin/python3", "-c", code]
    kw.setdefault("limits", LIMITS)
    res = await run(grading_shaped(scratch, uid, argv, tmp_bytes=16 * MIB, **kw), timeout=timeout)
    deadline = time.monotonic() + 5
    while live_pids(uids=range(uid, uid + 1)) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert live_pids(uids=range(uid, uid + 1)) == [], "a process of the sandbox survived it"
    assert our_cgroups() == [], "the sandbox's cgroup was left behind"
    return res


# ------------------------------------------------------------------------------------------------ resource limits


async def test_fork_bomb_is_stopped_by_pids(scratch: Path, uid: int) -> None:
    _cgroups_or_skip()
    # Forks until the kernel refuses, then every process ends by itself.
    code = (
        "import os, time\n"
        "n = 0\n"
        "try:\n"
        "    while True:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(2)\n"
        "            os._exit(0)\n"
        "        n += 1\n"
        "except OSError as exc:\n"
        "    print('refused', exc.errno, n)\n"
    )
    res = await attack(scratch, uid, code)
    assert res.exit_code == 0 and res.stdout_text.startswith(f"refused {errno.EAGAIN} "), res.stdout_text
    assert res.limit == "pids (cgroup pids.max=32)"
    assert int(res.stdout_text.split()[2]) < 32


async def test_endless_fork_bomb_ends_at_the_wall_clock_with_pids_named(scratch: Path, uid: int) -> None:
    _cgroups_or_skip()
    # The classic one: never ends by itself. The pids cap holds it at 32 processes until the wall clock kills the
    # whole tree; the limit that fired first is named, the wall clock with it.
    res = await attack(scratch, uid, "bomb() { bomb | bomb & }; bomb; sleep 30", shell=True, timeout=3)
    assert res.timed_out and res.killed
    assert res.limit == "pids (cgroup pids.max=32)"
    assert [h.kind for h in res.limits_hit] == ["pids", "wall-clock"]


async def test_memory_bomb_is_killed_by_the_cgroup(scratch: Path, uid: int) -> None:
    _cgroups_or_skip()
    code = "blocks = []\nwhile True:\n    blocks.append(bytearray(8 * 1024 * 1024))\n"
    res = await attack(scratch, uid, code)
    assert res.exit_code == 128 + 9, res.stdout_text  # the OOM killer's SIGKILL
    assert res.limit in (f"memory (cgroup memory.limit_in_bytes={64 * MIB})", f"memory (cgroup memory.max={64 * MIB})")
    assert res.limits_hit[0].describe() == "memory limit (cgroup, 64.0 MiB)"


async def test_a_tmpfs_is_memory_too(scratch: Path, uid: int) -> None:
    _cgroups_or_skip()
    # Filling a tmpfs larger than the memory cap: its pages live in RAM and are charged to the sandbox's cgroup, so
    # the tmpfs is no way round the memory limit.
    res = await attack(
        scratch,
        uid,
        "for i in $(seq 20); do head -c 8000000 /dev/zero > /testbed/f$i || exit 1; done; echo filled",
        shell=True,
        mounts=(Bind(scratch / "in", "/floe"), Tmpfs("/testbed", 256 * MIB)),
    )
    assert "filled" not in res.stdout_text and res.limit is not None and res.limit.startswith("memory ")


async def test_disk_fill_ends_in_enospc_and_a_big_file_in_sigxfsz(scratch: Path, uid: int) -> None:
    # Writing into the workspace tmpfs (32 MiB) and /tmp (16 MiB) until full: ENOSPC, in RAM, the host disk never
    # sees it. The memory cap is above both, so it is the tmpfs size that answers.
    code = (
        "import errno, itertools\n"
        "for where in ('/testbed', '/tmp'):\n"
        "    for i in itertools.count():\n"
        "        try:\n"
        "            with open(f'{where}/fill-{i}', 'wb') as fh:\n"
        "                fh.write(b'x' * (4 * 1024 * 1024))\n"
        "        except OSError as exc:\n"
        "            print(where, errno.errorcode[exc.errno], i)\n"
        "            break\n"
    )
    limits = Limits(nproc=4096, fsize_bytes=8 * MIB, memory_bytes=256 * MIB, pids=32)
    res = await attack(scratch, uid, code, limits=limits)
    lines = res.stdout_text.split("\n")
    assert lines[0].startswith("/testbed ENOSPC ") and lines[1].startswith("/tmp ENOSPC "), res.stdout_text
    assert res.exit_code == 0 and res.limit is None
    # One file past RLIMIT_FSIZE (8 MiB): the kernel's SIGXFSZ ends the writer, and the exit status names it.
    res = await attack(scratch, uid, "exec head -c 20000000 /dev/zero > /testbed/big", shell=True, limits=limits)
    assert res.exit_code == 128 + 25 and res.limit == f"file-size (RLIMIT_FSIZE={8 * MIB})"


# --------------------------------------------------------------------------------------------- the seccomp filter

# Each probe prints "name errno-name" (or "name ok"), from inside the sandbox, through libc.
PROBES = r"""
import ctypes, errno, os, socket
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NR = %(nr)r
def report(name, ret):
    print(name, "ok" if ret >= 0 else errno.errorcode[ctypes.get_errno()], flush=True)
def sys(name, *args):
    report(name, libc.syscall(ctypes.c_long(NR[name]), *[ctypes.c_long(a) for a in args]))
ret = libc.ptrace(16, os.getppid(), 0, 0)  # PTRACE_ATTACH to bwrap's init: it stops
if ret == 0:  # (only without the filter) let it go again, or the sandbox would never end
    os.waitpid(os.getppid(), 0x40000000)  # __WALL
    libc.ptrace(17, os.getppid(), 0, 0)  # PTRACE_DETACH
report("ptrace-attach-parent", ret)
child = os.fork()
if child == 0:  # in a child of ours: once traced, a stray signal would stop us for a tracer that never looks
    report("ptrace-traceme", libc.ptrace(0, 0, 0, 0))
    os._exit(0)
os.waitpid(child, 0)
buf = ctypes.create_string_buffer(8)
iov = (ctypes.c_void_p * 2)(ctypes.addressof(buf), 8)
sys("process_vm_readv", os.getppid(), ctypes.addressof(iov), 1, ctypes.addressof(iov), 1, 0)
os.makedirs("/tmp/m", exist_ok=True)
report("mount-tmpfs", libc.mount(b"none", b"/tmp/m", b"tmpfs", 0, None))
report("umount2", libc.umount2(b"/tmp", 0))
sys("keyctl", 0, -3, 0)  # KEYCTL_GET_KEYRING_ID of the session keyring: works for anyone without a filter
sys("add_key", 0, 0, 0, 0, 0)
report("unshare-user", libc.unshare(0x10000000))
report("unshare-mount", libc.unshare(0x00020000))
pid = libc.syscall(ctypes.c_long(NR["clone"]), ctypes.c_long(0x10000000 | 17), 0, 0, 0, 0)  # CLONE_NEWUSER|SIGCHLD
if pid == 0:
    os._exit(0)
report("clone-newuser", pid)
sys("clone3", 0, 0)
sys("setns", 0, 0)
sys("bpf", 0, 0, 0)
sys("perf_event_open", 0, 0, -1, -1, 0)
sys("userfaultfd", 0)
sys("io_uring_setup", 1, 0)
sys("init_module", 0, 0, 0)
sys("kexec_load", 0, 0, 0, 0)
sys("reboot", 0, 0, 0, 0)
sys("swapon", 0, 0)
sys("acct", 0)
report("personality-no-aslr", libc.personality(0x0040000))
report("personality-query", libc.personality(0xFFFFFFFF))
for name, family, kind in [("socket-raw-icmp", socket.AF_INET, socket.SOCK_RAW), ("socket-packet", socket.AF_PACKET,
        socket.SOCK_DGRAM), ("socket-raw6", socket.AF_INET6, socket.SOCK_RAW | socket.SOCK_CLOEXEC),
        ("socket-netlink", socket.AF_NETLINK, socket.SOCK_RAW), ("socket-tcp", socket.AF_INET, socket.SOCK_STREAM)]:
    try:
        socket.socket(family, kind).close()
        print(name, "ok", flush=True)
    except OSError as exc:
        print(name, errno.errorcode[exc.errno], flush=True)
print("done", flush=True)
"""

# What each probe gets with the filter. Without it (the second column) the same sandbox already refuses most of
# them (no capabilities, bwrap's --disable-userns); the ones that differ are what the filter adds.
EXPECTED = {
    "ptrace-attach-parent": "EPERM",
    "ptrace-traceme": "EPERM",
    "process_vm_readv": "EPERM",
    "mount-tmpfs": "EPERM",
    "umount2": "EPERM",
    "keyctl": "EPERM",
    "add_key": "EPERM",
    "unshare-user": "EPERM",
    "unshare-mount": "EPERM",
    "clone-newuser": "EPERM",
    "clone3": "ENOSYS",
    "setns": "EPERM",
    "bpf": "EPERM",
    "perf_event_open": "EPERM",
    "userfaultfd": "EPERM",
    "io_uring_setup": "ENOSYS",
    "init_module": "EPERM",
    "kexec_load": "EPERM",
    "reboot": "EPERM",
    "swapon": "EPERM",
    "acct": "EPERM",
    "personality-no-aslr": "EPERM",
    "personality-query": "ok",
    "socket-raw-icmp": "EPERM",
    "socket-packet": "EPERM",
    "socket-raw6": "EPERM",
    "socket-netlink": "ok",  # glibc's getifaddrs and getaddrinfo(AI_ADDRCONFIG) need it
    "socket-tcp": "ok",
}


def _probe_results(out: str) -> dict[str, str]:
    return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)


@pytest.fixture(scope="module")
def probes() -> str:
    return PROBES % {"nr": sc.ARCHES[platform.machine()].syscalls}


async def test_the_filter_refuses_what_a_sandbox_has_no_use_for(scratch: Path, uid: int, probes: str) -> None:
    res = await attack(scratch, uid, probes)
    assert res.stdout_text.rstrip().endswith("done"), res.stdout_text
    got = {k: v for k, v in _probe_results(res.stdout_text).items() if k in EXPECTED}
    assert got == EXPECTED
    assert res.seccomp


async def test_without_the_filter_some_of_them_work(scratch: Path, uid: int, probes: str) -> None:
    # What the filter adds: without it the sandbox's program could stop and trace bwrap's init, and reached the
    # kernel code of bpf, io_uring, keyrings... (refused only later, or not at all). The rest fail without it too:
    # no capabilities (mount, raw sockets, modules, reboot) and bwrap's --disable-userns (ENOSPC for a user ns).
    res = await attack(scratch, uid, probes, seccomp=False)
    got = _probe_results(res.stdout_text)
    assert res.stdout_text.rstrip().endswith("done"), res.stdout_text
    for name in ("ptrace-attach-parent", "ptrace-traceme", "keyctl", "personality-no-aslr"):
        assert got[name] == "ok", (name, got[name])
    for name in ("clone3", "bpf", "io_uring_setup", "perf_event_open", "add_key", "process_vm_readv", "setns"):
        assert got[name] not in ("EPERM", "ENOSYS"), (name, got[name])  # EINVAL/EFAULT: the kernel looked at it
    assert got["unshare-user"] == "ENOSPC" and got["mount-tmpfs"] == "EPERM"
    assert not res.seccomp


async def test_a_foreign_syscall_numbering_is_killed(scratch: Path, uid: int) -> None:
    if platform.machine() != "x86_64":
        pytest.skip("the x32 numbering is x86_64's")
    # getpid through the x32 table (bit 30): SIGSYS, the process is gone before the call runs.
    code = (
        "import ctypes\nlibc = ctypes.CDLL(None)\nprint(libc.syscall(39) > 0, flush=True)\n"
        "libc.syscall(0x40000000 | 39)\nprint('survived')"
    )
    res = await attack(scratch, uid, code)
    assert res.stdout_text == "True\n" and res.exit_code == 128 + 31  # SIGSYS


async def test_runtimes_still_work_under_the_filter(scratch: Path, uid: int) -> None:
    # threads (glibc tries clone3, falls back to clone), subprocesses, git, and node (libuv's io_uring probe falls
    # back, os.networkInterfaces uses netlink)
    script = (
        'python3 -c \'import threading, subprocess; t = threading.Thread(target=print, args=("thread",)); '
        't.start(); t.join(); print(subprocess.run(["true"]).returncode)\' && '
        "cd /tmp && git init -q r && cd r && git -c user.name=a -c user.email=a@b commit -q --allow-empty -m x && "
        "git log --oneline | wc -l && "
        "if command -v node >/dev/null; then node -e '"
        'const {Worker} = require("worker_threads"); require("os").networkInterfaces(); '
        'require("fs").writeFileSync("/tmp/n", "x"); '
        'new Worker("require(`worker_threads`).parentPort.postMessage(1)", {eval: true}).on("message", m => '
        'console.log("node", m, require("child_process").execSync("echo child").toString().trim()))\'; '
        "else echo no node; fi"
    )
    limits = Limits(nproc=4096, fsize_bytes=8 * MIB, memory_bytes=512 * MIB, pids=256)
    res = await attack(scratch, uid, script, shell=True, limits=limits)
    assert res.exit_code == 0, res.stdout_text
    node = "node 1 child" if shutil.which("node") else "no node"
    assert res.stdout_text.split("\n")[:4] == ["thread", "0", "1", node], res.stdout_text
    assert res.limit is None


# --------------------------------------------------------------------------------------------- writes outside


async def test_writes_outside_the_workspace_fail_and_the_host_is_unchanged(scratch: Path, uid: int) -> None:
    canary = Path("/root") / f"floe-attack-canary-{os.getpid()}"
    canary.write_text("host")
    inp = scratch / "in"
    inp.mkdir(exist_ok=True)
    os.chmod(inp, 0o755)
    (inp / "eval.sh").write_text("input")
    code = (
        "import errno\n"
        f"for path in ['/usr/floe-x', '/etc/passwd', '/floe/eval.sh', '/floe/new', {str(canary)!r}, '/root/x',"
        " '/run/floe/x', '/x']:\n"
        "    try:\n"
        "        open(path, 'w').write('sandbox')\n"
        "        print(path, 'written')\n"
        "    except OSError as exc:\n"
        "        print(path, errno.errorcode[exc.errno])\n"
    )
    try:
        res = await attack(scratch, uid, code)
        got = _probe_results(res.stdout_text)
        assert "written" not in got.values(), res.stdout_text
        assert got["/usr/floe-x"] == "EROFS" and got["/floe/eval.sh"] == "EROFS" and got["/floe/new"] == "EROFS"
        assert got["/x"] == "EROFS" and got["/run/floe/x"] == "EROFS"  # bwrap's root tmpfs: read-only
        assert got["/etc/passwd"] in ("EROFS", "EACCES") and got[str(canary)] in ("ENOENT", "EROFS", "EACCES")
        assert canary.read_text() == "host" and (inp / "eval.sh").read_text() == "input"
        assert not (inp / "new").exists() and not Path("/usr/floe-x").exists()
    finally:
        canary.unlink()


# ------------------------------------------------------------------------------------------------------ plumbing


def test_syscall_numbers_match_the_installed_headers() -> None:
    headers = {
        "x86_64": Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
        "aarch64": Path("/usr/include/asm-generic/unistd.h"),
    }
    checked = 0
    for machine, header in headers.items():
        if not header.exists():
            continue
        defined = {
            m.group(1): int(m.group(2)) for m in re.finditer(r"#define __NR(?:3264)?_(\w+)\s+(\d+)", header.read_text())
        }
        for name, nr in sc.ARCHES[machine].syscalls.items():
            if name in defined:  # headers older than a syscall do not name it
                assert defined[name] == nr, (machine, name)
                checked += 1
    if not checked:
        pytest.skip("no kernel headers installed")


def test_an_unknown_architecture_is_refused() -> None:
    with pytest.raises(SandboxError, match="no seccomp filter for architecture 'riscv64'"):
        sc.program("riscv64")
    assert len(sc.program("aarch64")) % 8 == 0 and len(sc.program("x86_64")) % 8 == 0


def test_a_stale_cgroup_is_swept(tmp_path: Path) -> None:
    _cgroups_or_skip()
    parent = next(p for p in parent_dirs() if p.parent.joinpath("cgroup.procs").exists())
    parent.mkdir(exist_ok=True)
    dead_pid = 99999999  # above pid_max: never a live process
    stale, young, ours = parent / f"sbx-{dead_pid}-1", parent / f"sbx-{dead_pid}-2", parent / f"sbx-{os.getpid()}-0"
    for d in (stale, young, ours):
        d.mkdir()
    old = time.time() - 3600
    # what a dead caller's sandbox left running in its cgroup (its watcher killed too) is killed by the sweep
    orphan = subprocess.Popen(["sleep", "600"], start_new_session=True)
    (stale / "cgroup.procs").write_text(str(orphan.pid))
    os.utime(stale, (old, old))
    os.utime(ours, (old, old))
    try:
        sweep_stale(force=True)
        assert orphan.wait(timeout=5) == -signal.SIGKILL
        if stale.exists():  # the kill is not instant: the next sweep removes it once its member has left
            sweep_stale(force=True)
        assert not stale.exists()
        assert young.exists() and ours.exists()
    finally:
        if orphan.poll() is None:
            orphan.kill()
            orphan.wait()
        for d in (stale, young, ours):
            if d.exists():
                d.rmdir()
