"""Where untrusted eval scripts run: the ``Sandbox`` protocol, the bubblewrap, bare and docker backends, and the probe.

``BwrapSandbox`` maps a grading ``Job`` to floe's one launcher (``libs/sandbox``; docs/scorer.md, "Sandbox"): an
unprivileged uid from a pool (one per concurrent job, so RLIMIT_NPROC is per job), ``prlimit`` (CPU seconds, address
space, processes, file size, open files, no core), then ``bwrap`` with read-only ``/usr`` and ``/etc``, a size-capped
``/tmp``, the job's input directory read-only at ``/floe`` and a size-capped tmpfs at ``/testbed`` (writes by the diff
land in RAM capped at ``testbed_bytes``; nothing on the host disk changes), no network, stdout and stderr merged and
capped (head + tail). The launcher adds the wall-clock timeout, the process-tree kill, and the lifeline: a job never
outlives the scorer, even one that dies while the job is starting.

What it does not cover (honest limits): no seccomp filter and no cgroup, so memory is capped by RLIMIT_AS only
(crude); the kernel is the security boundary; code under test shares the pytest process, so a diff that hooks
pytest from inside the module under test can still forge outcomes (test-infrastructure files are reverted by the
eval script, which closes the conftest route).

``BareSandbox`` runs the same script with the same rlimits but no isolation and no lifeline (benchmarks, and level
C where it is explicitly allowed). ``DockerSandbox`` builds the ``docker run`` argv for official SWE-bench instance
images.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import structlog

import sandbox
from sandbox import Bind, Capture, Keep, Mount, SandboxError, SandboxSpec, Tmpfs, UidPool, run_sync

__all__ = [
    "BareSandbox",
    "BwrapSandbox",
    "DockerSandbox",
    "ExecResult",
    "Job",
    "Limits",
    "ProbeResult",
    "Sandbox",
    "probe_bwrap",
]

log = structlog.get_logger()

OUTPUT_CAP = 4 * 1024 * 1024  # bytes of output kept (head + tail) for grading
# The eval script's environment (nothing of the scorer's): fixed TZ and hash seed so results do not drift.
JOB_ENV = {
    "PATH": "/floe/bin:/usr/bin:/bin",
    "HOME": "/tmp",
    "FLOE_IN": "/floe",
    "TESTBED": "/testbed",
    "TZ": "UTC",
    "LANG": "C.UTF-8",
    "PYTHONHASHSEED": "0",
    "PYTHONDONTWRITEBYTECODE": "1",
}


@dataclass(frozen=True)
class Limits:
    cpu_s: int = 120
    address_space_bytes: int = 4 * 1024**3
    nproc: int = 256
    fsize_bytes: int = 64 * 1024**2
    nofile: int = 1024
    testbed_bytes: int = 256 * 1024**2
    wall_s: float = 300.0

    def rlimits(self) -> sandbox.Limits:
        return sandbox.Limits(
            nofile=self.nofile,
            nproc=self.nproc,
            fsize_bytes=self.fsize_bytes,
            address_space_bytes=self.address_space_bytes,
            cpu_s=self.cpu_s,
        )


@dataclass(frozen=True)
class Job:
    """One script run: ``input_dir`` holds ``eval.sh`` (+ ``model.patch``, ``src/``) and is mounted read-only."""

    input_dir: Path
    limits: Limits
    image: str | None = None  # docker only
    name: str = "job"


@dataclass
class ExecResult:
    output: str
    returncode: int | None
    timed_out: bool
    duration_s: float
    isolation: str
    argv: list[str] = field(default_factory=list)


class Sandbox(Protocol):
    """Runs ``job.input_dir/eval.sh`` with stdout and stderr merged, within ``job.limits``."""

    name: str
    isolation: str  # "A" full bwrap recipe, "C" unsandboxed, "docker"

    def run(self, job: Job) -> ExecResult: ...


def _prlimit(limits: Limits) -> list[str]:
    return [
        "prlimit",
        f"--cpu={limits.cpu_s}",
        f"--as={limits.address_space_bytes}",
        f"--nproc={limits.nproc}",
        f"--fsize={limits.fsize_bytes}",
        f"--nofile={limits.nofile}",
        "--core=0",
        "--",
    ]


def _read_capped(path: Path) -> str:
    kept = Capture(OUTPUT_CAP // 2, OUTPUT_CAP // 2)
    with path.open("rb") as fh:
        while chunk := fh.read(1024 * 1024):
            kept.write(chunk)
    return kept.text()


def _execute(argv: list[str], limits: Limits, workdir: Path, isolation: str, env: dict[str, str]) -> ExecResult:
    """Run argv (bare or docker) in its own process group, output to a file; SIGKILL the group at the deadline."""
    out_path = workdir / "output.log"
    started = time.monotonic()
    timed_out = False
    with out_path.open("wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, env=env
        )
        try:
            proc.wait(timeout=limits.wall_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
        finally:
            if proc.returncode is None:
                _kill_group(proc)
    return ExecResult(
        output=_read_capped(out_path),
        returncode=proc.returncode,
        timed_out=timed_out,
        duration_s=time.monotonic() - started,
        isolation=isolation,
        argv=argv,
    )


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


class BwrapSandbox:
    name = "bwrap"
    isolation = "A"

    def __init__(
        self,
        *,
        ro_paths: Sequence[Path] = (),
        first_uid: int = 61000,
        pool_size: int = 16,
    ) -> None:
        self.ro_paths = [Path(p) for p in ro_paths]
        self.first_uid = first_uid
        self._uids = UidPool(first_uid, pool_size)
        self._as_root = os.geteuid() == 0

    def spec(self, job: Job, uid: int | None) -> SandboxSpec:
        """The job as a launcher spec: ``uid`` from the pool as root, ``None`` (the caller's) otherwise."""
        lim = job.limits
        mounts: list[Mount] = [Bind(p, str(p)) for p in self.ro_paths]
        mounts += [Bind(job.input_dir, "/floe"), Tmpfs("/testbed", lim.testbed_bytes)]
        return SandboxSpec(
            argv=["bash", "/floe/eval.sh"],
            uid=uid,
            gid=uid,
            env=JOB_ENV,
            cwd="/testbed",
            mounts=tuple(mounts),
            tmp_bytes=lim.testbed_bytes,
            limits=lim.rlimits(),
            # One stream: the markers come from ``set -x`` on stderr (evalscript); both ends are kept.
            stdout=Keep(head=OUTPUT_CAP // 2, tail=OUTPUT_CAP // 2),
            stderr=None,
        )

    def run(self, job: Job) -> ExecResult:
        if not self._as_root:
            return self._run(job, None)
        with self._uids.lease() as uid:
            return self._run(job, uid)

    def _run(self, job: Job, uid: int | None) -> ExecResult:
        spec = self.spec(job, uid)
        try:
            res = run_sync(spec, timeout=job.limits.wall_s)
        except SandboxError as exc:
            return ExecResult(f"sandbox did not start: {exc}", None, False, 0.0, self.isolation, spec.argv)
        return ExecResult(
            output=res.stdout_text,
            returncode=res.exit_code,
            timed_out=res.timed_out,
            duration_s=res.duration_s,
            isolation=self.isolation,
            argv=spec.argv,
        )


class BareSandbox:
    """No isolation: the script runs on the host in a temp testbed, with rlimits only. Level C."""

    name = "bare"
    isolation = "C"

    def run(self, job: Job) -> ExecResult:
        with tempfile.TemporaryDirectory(prefix="floe-bare-") as tmp:
            testbed = Path(tmp) / "testbed"
            testbed.mkdir()
            home = Path(tmp) / "home"
            home.mkdir()
            env = {
                "PATH": f"{job.input_dir / 'bin'}:/usr/bin:/bin",
                "HOME": str(home),
                "FLOE_IN": str(job.input_dir),
                "TESTBED": str(testbed),
                "TZ": "UTC",
                "LANG": "C.UTF-8",
                "PYTHONHASHSEED": "0",
                "PYTHONDONTWRITEBYTECODE": "1",
            }
            argv = [*_prlimit(job.limits), "bash", str(job.input_dir / "eval.sh")]
            return _execute(argv, job.limits, Path(tmp), self.isolation, env=env)


class DockerSandbox:
    """Official SWE-bench instance images (``swebench/sweb.eval.x86_64.<id with __ -> _1776_>:latest``).

    The eval script activates the image's ``testbed`` conda env and uses its ``/testbed`` (no ``src/`` input).
    Only the argv is tested on machines without Docker.
    """

    name = "docker"
    isolation = "docker"

    def __init__(self, docker: str = "docker", namespace: str = "swebench") -> None:
        self.docker = docker
        self.namespace = namespace

    def image_for(self, instance_id: str) -> str:
        return f"{self.namespace}/sweb.eval.x86_64.{instance_id.replace('__', '_1776_')}:latest".lower()

    def argv(self, job: Job) -> list[str]:
        lim = job.limits
        return [
            self.docker,
            "run",
            "--rm",
            "--name",
            f"sweb.eval.{job.name}",
            "--network",
            "none",
            "--memory",
            str(lim.address_space_bytes),
            "--pids-limit",
            str(lim.nproc),
            "--ulimit",
            f"cpu={lim.cpu_s}",
            "--ulimit",
            f"fsize={lim.fsize_bytes}",
            "--ulimit",
            f"nofile={lim.nofile}",
            "--security-opt",
            "no-new-privileges",
            "--cap-drop",
            "ALL",
            "-e",
            "FLOE_IN=/floe",
            "-e",
            "TESTBED=/testbed",
            "-v",
            f"{job.input_dir}:/floe:ro",
            "--workdir",
            "/testbed",
            "--entrypoint",
            "bash",
            job.image or "",
            "/floe/eval.sh",
        ]

    def run(self, job: Job) -> ExecResult:
        if shutil.which(self.docker) is None:
            return ExecResult(
                output=f"docker binary {self.docker!r} not found",
                returncode=None,
                timed_out=False,
                duration_s=0.0,
                isolation=self.isolation,
            )
        with tempfile.TemporaryDirectory(prefix="floe-docker-") as tmp:
            return _execute(self.argv(job), job.limits, Path(tmp), self.isolation, env=dict(os.environ))


@dataclass(frozen=True)
class ProbeResult:
    level: str  # "A" or "C"
    checks: dict[str, bool]
    detail: str


_PROBE_SCRIPT = """
echo uid=$(id -u)
if echo x > /usr/floe-probe 2>/dev/null; then echo usr_writable; fi
if ( exec 3<>/dev/tcp/192.0.2.1/80 ) 2>/dev/null; then echo net_reachable; fi
if [ -e /root ] && ls /root >/dev/null 2>&1; then echo root_home_visible; fi
echo probe_done
"""


def probe_bwrap(sandbox: BwrapSandbox, work_dir: Path) -> ProbeResult:
    """Run a probe script through the full recipe and check what isolation actually holds."""
    if shutil.which("bwrap") is None:
        return ProbeResult("C", {"bwrap_installed": False}, "bwrap is not installed (apt-get install bubblewrap)")
    work_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="probe-", dir=work_dir) as tmp:
        inp = Path(tmp)
        inp.chmod(0o755)
        (inp / "eval.sh").write_text(_PROBE_SCRIPT)
        (inp / "eval.sh").chmod(0o644)
        res = sandbox.run(Job(input_dir=inp, limits=Limits(cpu_s=10, wall_s=20.0), name="probe"))
    out = res.output
    uid_line = next((ln for ln in out.splitlines() if ln.startswith("uid=")), "uid=?")
    checks = {
        "bwrap_installed": True,
        "started": "probe_done" in out,
        "unprivileged": uid_line not in ("uid=0", "uid=?"),
        "system_read_only": "usr_writable" not in out,
        "network_unreachable": "net_reachable" not in out,
        "host_home_hidden": "root_home_visible" not in out,
    }
    level = "A" if all(checks.values()) else "C"
    detail = "full bwrap recipe works" if level == "A" else f"probe failed: {out.strip()[-400:]}"
    log.info("sandbox probe", level=level, checks=checks, python=sys.executable)
    return ProbeResult(level, checks, detail)
