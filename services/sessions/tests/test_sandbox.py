"""The session's sandbox shape (``sessions.launch``): the agent uid, host hidden, the session's paths, its limits.

The launcher itself (bridge, kill, lifeline, capture) is tested in ``libs/sandbox/tests``; here, what a session's
settings make of it.
"""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path

from sandbox import SandboxProcess
from sessions.launch import session_spec
from sessions.settings import SessionSettings


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


async def run_in(settings: SessionSettings, script: str) -> tuple[int, str, str, SandboxProcess]:
    ws, home, run = dirs(settings)
    proc = SandboxProcess(session_spec(settings, ["/bin/sh", "-c", script], workspace=ws, home=home, run_dir=run))
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
