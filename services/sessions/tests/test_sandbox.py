"""The bubblewrap sandbox: unprivileged, hidden host, no network but the bridge, bounded output, nothing survives."""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
from pathlib import Path

import pytest

from sessions.bridge import UnixBridge
from sessions.sandbox import SandboxProcess, SandboxSpec, TailBuffer
from sessions.settings import SessionSettings

from .conftest import sandbox_processes


def dirs(settings: SessionSettings) -> tuple[Path, Path, Path]:
    base = settings.work_root / "sessions" / secrets.token_hex(4)
    ws, home, run = base / "ws", base / "home", base / "run"
    for d in (ws, home, run):
        d.mkdir(parents=True)
    for d in (base.parent, base, run):
        os.chmod(d, 0o755)
    for d in (ws, home):
        os.chown(d, settings.agent_uid, settings.agent_gid)
    return ws, home, run


async def run_in(settings: SessionSettings, script: str, **kw: object) -> tuple[int, str, str, SandboxProcess]:
    ws, home, run = dirs(settings)
    spec = SandboxSpec(argv=["/bin/sh", "-c", script], workspace=ws, home=home, run_dir=run, **kw)  # type: ignore[arg-type]
    proc = SandboxProcess(settings, spec)
    await proc.start()
    try:
        code = await proc.wait(timeout=30)
    finally:
        await proc.kill()
    shutil.rmtree(ws.parent)
    return code, proc.stdout.text(), proc.stderr.text(), proc


async def test_runs_unprivileged_with_host_hidden_and_system_read_only(settings: SessionSettings) -> None:
    code, out, err, _ = await run_in(
        settings,
        "id -u; id -un; pwd; echo $HOME; ls /work /root /var /home/other 2>&1 | wc -l; "
        "touch /usr/x 2>/dev/null && echo usr-writable; touch /etc/x 2>/dev/null && echo etc-writable; "
        "echo data > /workspace/ok && cat /workspace/ok; echo h > $HOME/h && cat $HOME/h",
    )
    lines = out.split()
    assert code == 0, err
    assert lines[:4] == [str(settings.agent_uid), "agent", "/workspace", "/home/agent"]
    assert "usr-writable" not in out and "etc-writable" not in out
    assert lines[-2:] == ["data", "h"]


async def test_no_network_except_bridge(settings: SessionSettings) -> None:
    # A real TCP server on the host's loopback: the sandbox cannot reach it directly, only through its bridge.
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.write(b"pong\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    ws, home, run = dirs(settings)
    bridge = UnixBridge(run / "gw.sock", "127.0.0.1", port)
    await bridge.start()
    probe = (
        "import socket,sys\n"
        "def talk(port):\n"
        "    try:\n"
        "        s = socket.create_connection(('127.0.0.1', port), timeout=3); s.sendall(b'ping\\n')\n"
        "        return s.makefile().readline().strip()\n"
        "    except OSError as e:\n"
        "        return 'refused'\n"
        f"print(talk({port}), talk({settings.inner_gateway_port}))\n"
    )
    spec = SandboxSpec(
        argv=["python3", "-c", probe], workspace=ws, home=home, run_dir=run, bridge_socket=run / "gw.sock"
    )
    proc = SandboxProcess(settings, spec)
    await proc.start()
    code = await proc.wait(timeout=30)
    await proc.kill()
    await bridge.close()
    server.close()
    shutil.rmtree(ws.parent)
    assert code == 0, proc.stderr.text()
    assert proc.stdout.text().split() == ["refused", "pong"]
    assert bridge.connections == 1


async def test_kill_takes_down_daemonized_children(settings: SessionSettings) -> None:
    marker = f"floe-leak-{secrets.token_hex(4)}"
    ws, home, run = dirs(settings)
    script = f"setsid nohup python3 -c 'import time; time.sleep(300)' {marker} >/dev/null 2>&1 & sleep 300"
    spec = SandboxSpec(argv=["/bin/sh", "-c", script], workspace=ws, home=home, run_dir=run)
    proc = SandboxProcess(settings, spec)
    await proc.start()
    for _ in range(200):
        if sandbox_processes(marker):
            break
        await asyncio.sleep(0.02)
    assert sandbox_processes(marker), "the daemon never started"
    with pytest.raises(TimeoutError):
        await proc.wait(timeout=0.2)
    await proc.kill()
    assert await proc.wait_gone()
    shutil.rmtree(ws.parent)
    for _ in range(100):
        if not sandbox_processes(marker):
            break
        await asyncio.sleep(0.02)
    assert sandbox_processes(marker) == []


async def test_a_sandbox_takes_itself_down_when_its_lifeline_is_cut(settings: SessionSettings) -> None:
    # What a node's death does to the pipe (the kernel closes the write end), without killing anything ourselves:
    # the launcher's helper must kill the harness and its daemon, so nothing waits on them. This is the backstop
    # for the window before bwrap arms --die-with-parent.
    marker = f"floe-orphan-{secrets.token_hex(4)}"
    ws, home, run = dirs(settings)
    script = f"setsid nohup python3 -c 'import time; time.sleep(300)' {marker} >/dev/null 2>&1 & sleep 300"
    spec = SandboxSpec(argv=["/bin/sh", "-c", script], workspace=ws, home=home, run_dir=run)
    proc = SandboxProcess(settings, spec)
    await proc.start()
    try:
        for _ in range(200):
            if sandbox_processes(marker):
                break
            await asyncio.sleep(0.02)
        assert sandbox_processes(marker), "the daemon never started"
        proc._cut_lifeline()
        code = await proc.wait(timeout=15)  # no kill from us: the sandbox ended by itself
        assert code != 0
        assert proc.ns_init_pid is not None and await proc.wait_gone(timeout=5)
        assert sandbox_processes(marker) == []
    finally:
        await proc.kill()
        shutil.rmtree(ws.parent)


async def test_flooding_output_keeps_only_the_tail(settings: SessionSettings) -> None:
    code, out, _err, proc = await run_in(
        settings, "head -c 30000000 /dev/zero | tr '\\0' 'a'; echo; echo END; head -c 5000000 /dev/zero >&2"
    )
    assert code == 0
    assert out.endswith("END\n") and len(out) <= settings.output_tail_bytes
    assert proc.stdout.total == 30_000_000 + 5 and proc.stderr.total == 5_000_000


async def test_rlimits_apply(work_root: Path) -> None:
    settings = SessionSettings(work_root=work_root, rlimit_fsize_mb=1, rlimit_nofile=100)
    _code, out, _err, _ = await run_in(
        settings, "ulimit -n; ulimit -c; head -c 3000000 /dev/zero > /workspace/big; echo rc=$?; wc -c < /workspace/big"
    )
    lines = out.split()
    assert lines[0] == "100" and lines[1] == "0"
    assert "rc=0" not in out and lines[-1] == str(1024 * 1024)


def test_tail_buffer_bounded() -> None:
    tail = TailBuffer(10)
    for _ in range(1000):
        tail.write(b"0123456789abc")
    assert tail.text() == ("0123456789abc" * 2)[-10:]
    assert tail.total == 13_000
