"""What a sandboxed program sees and may do, for both shapes: its uid, a hidden host, a read-only system, no network
but the bridge, its limits, exactly its environment, bounded output."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
from pathlib import Path

import pytest

from sandbox import Bind, Bridge, Keep, Limits, SandboxError, SandboxProcess, SandboxSpec, run, run_sync

from .conftest import Shape, grading_shaped, live_pids, session_shaped


async def sh(
    spec_shape: Shape, scratch: Path, uid: int, script: str, argv0: str | None = None, **kw: object
) -> tuple[int | None, str]:
    argv = [argv0] if argv0 is not None else ["/bin/sh", "-c", script]
    res = await run(spec_shape(scratch, uid, argv, **kw), timeout=30)
    return res.exit_code, res.stdout_text + res.stderr_text


async def test_unprivileged_host_hidden_system_read_only(shape: Shape, scratch: Path, uid: int) -> None:
    code, out = await sh(
        shape,
        scratch,
        uid,
        "id -u; id -g; id -G; cat /proc/self/status | grep -E '^(CapEff|NoNewPrivs)'; "
        "ls /work /root /var /home/other /run/user 2>/dev/null | wc -l; "
        "touch /usr/x /etc/x /run/floe/x 2>/dev/null || echo ro; "
        "unshare -U true 2>/dev/null || echo no-userns; echo done",
    )
    lines = out.split("\n")
    assert code == 0, out
    assert lines[:3] == [str(uid), str(uid), str(uid)], out  # no supplementary groups
    assert "CapEff:\t0000000000000000" in out and "NoNewPrivs:\t1" in out
    assert lines[5:8] == ["0", "ro", "no-userns"], out


async def test_the_environment_is_exactly_the_spec(shape: Shape, scratch: Path, uid: int) -> None:
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "ONLY": "this"}
    code, out = await sh(shape, scratch, uid, "env", argv0="/usr/bin/env", env=env)
    assert code == 0, out
    # bwrap adds PWD (its --chdir), nothing else does
    expected = [f"{k}={v}" for k, v in env.items()] + [f"PWD={shape(scratch, uid, ['x']).cwd}"]
    assert sorted(out.split()) == sorted(expected)


async def test_identity_is_its_own_passwd(scratch: Path, uid: int) -> None:
    code, out = await sh(session_shaped, scratch, uid, "id -un; wc -l < /etc/passwd; getent passwd root | cut -d: -f7")
    assert code == 0 and out.split() == ["agent", "2", "/usr/sbin/nologin"], out


async def test_tmpfs_caps_writes_in_ram(scratch: Path, uid: int) -> None:
    # 32 MiB testbed: a 40 MiB write fails there, and the input is read-only; the host disk never sees either.
    _code, out = await sh(
        grading_shaped,
        scratch,
        uid,
        "head -c 40000000 /dev/zero > /testbed/big 2>/dev/null; echo rc=$?; ls -l /testbed/big | cut -d' ' -f5; "
        "touch /floe/x 2>/dev/null || echo input-ro",
        limits=Limits(fsize_bytes=1024**3),
    )
    lines = out.split()
    assert lines[0] != "rc=0" and int(lines[1]) <= 32 * 1024**2 and lines[2] == "input-ro", out


async def test_rlimits_apply(shape: Shape, scratch: Path, uid: int) -> None:
    limits = Limits(nofile=100, nproc=50, fsize_bytes=1024 * 1024, address_space_bytes=512 * 1024**2, cpu_s=7)
    _code, out = await sh(
        shape,
        scratch,
        uid,
        "grep -E '^Max (open files|processes|core file size|address space|cpu time|file size)' /proc/self/limits;"
        "head -c 3000000 /dev/zero > /tmp/big 2>/dev/null; echo rc=$?; wc -c < /tmp/big",
        limits=limits,
    )
    soft = {line.rsplit(None, 3)[0]: line.rsplit(None, 3)[1] for line in out.splitlines() if line.startswith("Max")}
    assert soft == {
        "Max cpu time": "7",
        "Max file size": str(1024 * 1024),
        "Max core file size": "0",
        "Max processes": "50",
        "Max open files": "100",
        "Max address space": str(512 * 1024**2),
    }, out
    assert "rc=0" not in out and out.split()[-1] == str(1024 * 1024)


async def test_cpu_limit_kills_a_busy_loop(scratch: Path, uid: int) -> None:
    res = await run(
        grading_shaped(scratch, uid, ["/bin/sh", "-c", "while :; do :; done"], limits=Limits(cpu_s=1)), timeout=30
    )
    assert res.exit_code is not None and res.exit_code > 128 and not res.timed_out


async def test_wall_clock_timeout_kills_the_tree(shape: Shape, scratch: Path, uid: int) -> None:
    res = await run(shape(scratch, uid, ["/bin/sh", "-c", "sleep 300 & sleep 300"]), timeout=0.5)
    assert res.timed_out and res.killed and res.duration_s < 10
    assert res.exit_code == -9  # bwrap itself was killed
    assert live_pids(uids=range(uid, uid + 1)) == []


async def test_no_network_except_the_bridge(scratch: Path, uid: int) -> None:
    # A real TCP server on the host's loopback: the sandbox cannot reach it directly, only through its bridge.
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.write(b"pong\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    probe = (
        "import socket\n"
        "def talk(port):\n"
        "    try:\n"
        "        s = socket.create_connection(('127.0.0.1', port), timeout=3); s.sendall(b'ping\\n')\n"
        "        return s.makefile().readline().strip()\n"
        "    except OSError:\n"
        "        return 'refused'\n"
        "def out():\n"
        "    try:\n"
        "        socket.create_connection(('192.0.2.1', 80), timeout=2)\n"
        "        return 'reached'\n"
        "    except OSError:\n"
        "        return 'unreachable'\n"
        f"print(talk({port}), talk(18080), out())\n"
    )
    spec = session_shaped(scratch, uid, ["python3", "-c", probe], bridge=Bridge(18080, ("127.0.0.1", port)))
    proc = SandboxProcess(spec)
    await proc.start()
    try:
        code = await proc.wait(timeout=30)
    finally:
        await proc.kill()
        server.close()
    assert code == 0, proc.stderr.text()
    assert proc.stdout.text().split() == ["refused", "pong", "unreachable"]
    assert proc.bridge is not None and proc.bridge.connections == 1
    assert not (scratch / "run" / "gateway.sock").exists(), "the bridge is closed with the sandbox"


async def test_host_network_only_when_asked(scratch: Path, uid: int) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"pong\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    probe = f"exec 3<>/dev/tcp/127.0.0.1/{port} && head -n1 <&3 || echo refused"
    try:
        _, shared = await sh(session_shaped, scratch, uid, f"bash -c '{probe}' 2>/dev/null", network="host")
        _, own = await sh(session_shaped, scratch, uid, f"bash -c '{probe}' 2>/dev/null")
    finally:
        server.close()
    assert (shared.split(), own.split()) == (["pong"], ["refused"])


async def test_flooding_output_keeps_head_and_tail(scratch: Path, uid: int) -> None:
    script = "echo START; head -c 30000000 /dev/zero | tr '\\0' 'a'; echo; echo END >&2"
    res = await run(
        grading_shaped(scratch, uid, ["/bin/sh", "-c", script], stdout=Keep(head=1000, tail=1000)), timeout=60
    )
    assert res.exit_code == 0 and res.stdout_overflowed
    text = res.stdout_text
    assert text.startswith("START\n") and text.endswith("END\n") and "output truncated by floe" in text
    assert len(res.stdout) < 3000 and res.stdout_total == 6 + 30_000_000 + 1 + 4
    assert res.stderr == b""  # merged


async def test_separate_streams_keep_the_tail(scratch: Path, uid: int) -> None:
    script = "head -c 3000000 /dev/zero | tr '\\0' 'a'; echo; echo END; head -c 500000 /dev/zero >&2"
    res = await run(session_shaped(scratch, uid, ["/bin/sh", "-c", script]), timeout=60)
    assert res.stdout_text.endswith("END\n") and len(res.stdout) == 64 * 1024
    assert res.stdout_total == 3_000_005 and res.stderr_total == 500_000


async def test_everything_kept_while_it_fits(scratch: Path, uid: int) -> None:
    spec = session_shaped(scratch, uid, ["/bin/sh", "-c", "printf 'a%.0s' $(seq 100)"], stdout=Keep(head=100, tail=0))
    res = await run(spec, timeout=30)
    assert res.stdout == b"a" * 100 and not res.stdout_overflowed
    res = await run(dataclasses.replace(spec, stdout=Keep(head=99, tail=0)), timeout=30)
    assert res.stdout == b"a" * 99 and res.stdout_overflowed


def test_run_sync_from_threads_and_from_a_loop(scratch: Path, uid: int) -> None:
    results: list[int] = []

    def grade(i: int) -> None:
        spec = grading_shaped(scratch / str(i), uid + 1 + i, ["/bin/sh", "-c", f"exit {i}"])
        code = run_sync(spec, timeout=30).exit_code
        results.append(-1 if code is None else code)

    for i in range(2):
        (scratch / str(i)).mkdir(mode=0o755)
    threads = [threading.Thread(target=grade, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [0, 1]

    async def inside_a_loop() -> int | None:
        return run_sync(grading_shaped(scratch, uid, ["/bin/sh", "-c", "exit 3"]), timeout=30).exit_code

    assert asyncio.run(inside_a_loop()) == 3


async def test_failures_to_start_are_sandbox_errors(scratch: Path, uid: int, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SandboxError, match="as root"):
        await run(dataclasses.replace(session_shaped(scratch, uid, ["true"]), uid=None, gid=None), timeout=5)
    hidden = scratch / "private" / "tool"
    hidden.mkdir(parents=True)
    os.chmod(scratch / "private", 0o700)
    spec = session_shaped(scratch, uid, ["true"])
    pinned = dataclasses.replace(spec, mounts=(*spec.mounts, Bind(hidden, "/opt/tool", pin=True)))
    with pytest.raises(SandboxError, match="not reachable by the sandbox uid"):
        await run(pinned, timeout=5)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SandboxError, match=r"bubblewrap|util-linux"):
        await run(spec, timeout=5)
    # Nothing of the failed starts is left: no bridge socket, no private run directory.
    assert not (scratch / "run" / "gateway.sock").exists()


async def test_bwrap_failing_reports_itself(scratch: Path, uid: int) -> None:
    spec = grading_shaped(scratch, uid, ["true"])
    broken = dataclasses.replace(spec, mounts=(Bind(scratch / "missing", "/floe"),))
    res = await run(broken, timeout=10)
    assert res.exit_code == 1 and "bwrap" in res.stdout_text, res


def test_spec_invariants() -> None:
    with pytest.raises(ValueError, match="command"):
        SandboxSpec(argv=[], uid=1, gid=1)
    with pytest.raises(ValueError, match="together"):
        SandboxSpec(argv=["x"], uid=1, gid=None)
    with pytest.raises(ValueError, match="network must be 'none'"):
        SandboxSpec(argv=["x"], uid=1, gid=1, network="host", bridge=Bridge(1, ("h", 1)))
