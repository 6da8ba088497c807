"""The command line, read as a recipe: order of the chain, isolation flags, mount order, the launcher."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandbox import RUN_MOUNT, Bind, Bridge, Identity, Limits, SandboxSpec, Tmpfs
from sandbox.cgroup import Cgroup
from sandbox.command import build_command


def spec(**kw: object) -> SandboxSpec:
    fields: dict[str, object] = {"argv": ["bash", "/floe/eval.sh"], "uid": 61005, "gid": 61005}
    fields.update(kw)
    return SandboxSpec(**fields)  # type: ignore[arg-type]


def test_chain_order_and_isolation_flags() -> None:
    limits = Limits(nofile=10, nproc=9, fsize_bytes=8, address_space_bytes=7, cpu_s=6)
    argv = build_command(spec(limits=limits), Path("/r"), pinned={}, lifeline_fd=5, info_fd=6, seccomp_fd=7)
    tools = [
        os.path.basename(a)
        for a in argv
        if a.startswith("/") and os.path.basename(a) in ("prlimit", "setpriv", "bwrap")
    ]
    assert tools == ["prlimit", "setpriv", "bwrap"]  # rlimits set as root, then the drop, then the sandbox
    for flag in ("--nofile=10", "--nproc=9", "--fsize=8", "--as=7", "--cpu=6:7", "--core=0"):
        assert flag in argv
    for flag in ("--reuid=61005", "--regid=61005", "--clear-groups", "--no-new-privs"):
        assert flag in argv
    for flag in ("--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session"):
        assert flag in argv
    assert "--share-net" not in argv
    assert argv[argv.index("--info-fd") + 1] == "6"
    assert argv[argv.index("--seccomp") + 1] == "7"  # on by default
    assert argv[0].endswith("prlimit")  # no cgroup asked for: no join
    launcher = argv.index("--", argv.index("/dev"))
    # No bridge: the shell launcher (no Python start per sandbox).
    assert argv[launcher + 1 : launcher + 6] == [
        "/bin/bash",
        "-p",
        f"{RUN_MOUNT}/sandbox_init.sh",
        "5",
        "--unset-shlvl",
    ]
    assert argv[-3:] == ["--", "bash", "/floe/eval.sh"]


def test_no_uid_no_drop_and_host_network_on_request() -> None:
    argv = build_command(spec(uid=None, gid=None, network="host"), Path("/r"), pinned={}, lifeline_fd=5, seccomp_fd=7)
    assert not any(a.endswith("setpriv") for a in argv) and "--share-net" in argv
    assert "--as=" not in " ".join(argv) and "--cpu=" not in " ".join(argv)


def test_seccomp_is_required_unless_switched_off() -> None:
    with pytest.raises(ValueError, match="seccomp"):
        build_command(spec(), Path("/r"), pinned={}, lifeline_fd=5)
    assert "--seccomp" not in build_command(spec(seccomp=False), Path("/r"), pinned={}, lifeline_fd=5)


def test_the_cgroup_join_comes_first_as_root() -> None:
    cg = Cgroup(1, Path("/cg/memory/floe/sbx-1-1"), Path("/cg/pids/floe/sbx-1-1"), 64 * 1024**2, 32)
    cg.dirs += [Path("/cg/memory/floe/sbx-1-1"), Path("/cg/pids/floe/sbx-1-1")]
    argv = build_command(spec(), Path("/r"), pinned={}, lifeline_fd=5, seccomp_fd=7, cgroup=cg)
    # /bin/sh -c SCRIPT floe-cgroup-join LIFELINE PROCS... -- prlimit ...: it leaves its watcher on the lifeline,
    # joins, then execs the rest of the chain
    procs = ["/cg/memory/floe/sbx-1-1/cgroup.procs", "/cg/pids/floe/sbx-1-1/cgroup.procs"]
    assert argv[:2] == ["/bin/sh", "-c"] and argv[3:8] == ["floe-cgroup-join", "5", *procs, "--"]
    assert argv[8].endswith("prlimit") and argv.index("--seccomp") > argv.index("--unshare-all")
    # the cgroup's pids.max must be the limit that fires, not RLIMIT_NPROC (default 256 here, above 32 + 16)
    assert "--nproc=256" in argv
    small = spec(limits=Limits(nproc=20))
    assert "--nproc=48" in build_command(small, Path("/r"), pinned={}, lifeline_fd=5, seccomp_fd=7, cgroup=cg)


def test_mount_order_tmp_before_the_spec_mounts_run_dir_last() -> None:
    pin = Bind(Path("/opt/harness"), "/opt/harness", pin=True)
    mounts = (
        Bind(Path("/tmp/env"), "/tmp/env"),
        pin,
        Bind(Path("/w"), "/workspace", writable=True),
        Tmpfs("/testbed", 1234),
    )
    argv = build_command(
        spec(mounts=mounts, tmp_bytes=99, cwd="/testbed"), Path("/r"), pinned={pin: 9}, lifeline_fd=5, seccomp_fd=7
    )
    tmp = next(i for i in range(len(argv) - 1) if argv[i : i + 2] == ["--tmpfs", "/tmp"])
    assert argv[tmp - 2 : tmp] == ["--size", "99"]
    assert tmp < argv.index("/tmp/env")  # a mount under /tmp is not shadowed by the tmpfs
    assert argv[argv.index("/tmp/env") - 1] == "--ro-bind"
    assert argv[argv.index("/opt/harness") - 2 : argv.index("/opt/harness")] == ["--ro-bind-fd", "9"]
    assert argv[argv.index("/workspace") - 2] == "--bind"
    t = argv.index("/testbed")
    assert argv[t - 5 : t] == ["--perms", "0755", "--size", "1234", "--tmpfs"]
    assert argv[argv.index(RUN_MOUNT) - 2 : argv.index(RUN_MOUNT)] == ["--ro-bind", "/r"]
    assert argv.index(RUN_MOUNT) > t and argv[argv.index("--chdir") + 1] == "/testbed"
    # the root tmpfs (no size of its own) is read-only once every mount point exists
    assert argv[argv.index("--remount-ro") + 1] == "/" and argv.index("--remount-ro") > argv.index(RUN_MOUNT)
    for hidden in ("/run", "/var/run/docker.sock", "/root", "/home"):
        assert hidden not in argv


def test_bridge_and_identity() -> None:
    s = spec(bridge=Bridge(18080, ("127.0.0.1", 1)), identity=Identity("agent", "/home/agent"))
    argv = build_command(s, Path("/r"), pinned={}, lifeline_fd=5, seccomp_fd=7)
    launcher = argv.index("--", argv.index("/dev"))
    # The bridge needs a TCP listener inside: the Python launcher.
    assert argv[launcher + 1 : launcher + 7] == [
        "/usr/bin/python3",
        "-I",
        "-S",
        f"{RUN_MOUNT}/sandbox_init.py",
        "--lifeline",
        "5",
    ]
    assert argv[argv.index("--bridge") + 1 : argv.index("--bridge") + 3] == ["18080", f"{RUN_MOUNT}/gateway.sock"]
    assert argv[argv.index("/etc/passwd") - 1] == "/r/passwd" and argv[argv.index("/etc/group") - 1] == "/r/group"
