"""Where untrusted eval scripts run: the ``Sandbox`` protocol, the bubblewrap, bare and docker backends, and the probe.

``BwrapSandbox`` maps a grading ``Job`` to floe's one launcher (``libs/sandbox``; docs/scorer.md, "Sandbox"): an
unprivileged uid from a pool (one per concurrent job, so RLIMIT_NPROC is per job), a cgroup of its own where the
machine has one (``memory_bytes`` of RAM + swap for the whole job, tmpfs pages included, and ``nproc`` processes and
threads as ``pids.max``), ``prlimit`` (CPU seconds, address space as a backstop above the cgroup cap, processes,
file size, open files, no core), then ``bwrap`` with the launcher's seccomp filter (no ptrace, mounts, namespaces,
keyrings, bpf, perf, raw sockets...; ``sandbox.seccomp``), read-only ``/usr`` and ``/etc``, a size-capped ``/tmp``,
the job's input directory read-only at ``/floe`` and a size-capped tmpfs at ``/testbed`` (writes by the diff land in
RAM capped at ``testbed_bytes``; nothing on the host disk changes), no network, stdout and stderr merged and capped
(head + tail). The launcher adds the wall-clock timeout, the process-tree kill, and the lifeline: a job never
outlives the scorer, even one that dies while the job is starting. ``ExecResult.limits_hit`` says which limit fired
(the evaluator's reason names it); ``probe_bwrap`` says whether the seccomp filter and the cgroup limits are in force.

What it does not cover (honest limits): without cgroups (not root, no memory/pids controller) memory is capped by
RLIMIT_AS only (crude, per process) and processes by RLIMIT_NPROC; CPU is capped per process in CPU seconds, not as
a share; the kernel is still the security boundary (the filter narrows it, it does not remove it); code under test
shares the pytest process, so a diff that hooks pytest from inside the module under test can still forge outcomes
(test-infrastructure files are reverted by the eval script, which closes the conftest route).

``BareSandbox`` runs the same script with the same rlimits but no isolation and no lifeline (benchmarks, and level
C where it is explicitly allowed). ``DockerSandbox`` builds the ``docker run`` argv for official SWE-bench instance
images.
"""

from __future__ import annotations

import contextlib
import os
import secrets
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
from scorer.images import image_name

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
    "probe_docker",
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
    address_space_bytes: int = 4 * 1024**3  # RLIMIT_AS per process; above memory_bytes, so the cgroup fires first
    nproc: int = 256  # processes (and threads) per job: the cgroup's pids.max, and RLIMIT_NPROC behind it
    fsize_bytes: int = 64 * 1024**2
    nofile: int = 1024
    testbed_bytes: int = 256 * 1024**2
    wall_s: float = 300.0
    memory_bytes: int = 2 * 1024**3  # cgroup: RAM + swap of the whole job (bwrap backend)

    def rlimits(self) -> sandbox.Limits:
        return sandbox.Limits(
            nofile=self.nofile,
            nproc=self.nproc,
            fsize_bytes=self.fsize_bytes,
            address_space_bytes=self.address_space_bytes,
            cpu_s=self.cpu_s,
            memory_bytes=self.memory_bytes,
            pids=self.nproc,
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
    # bwrap backend: the limits that fired (most telling first), the cgroup limits in force or why not, and whether
    # the seccomp filter was applied
    limits_hit: tuple[sandbox.LimitHit, ...] = ()
    cgroup: str | None = None
    cgroup_missing: str | None = None
    seccomp: bool = False


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
            limits_hit=res.limits_hit,
            cgroup=res.cgroup,
            cgroup_missing=res.cgroup_missing,
            seccomp=res.seccomp,
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
    """SWE-bench instance images: ``<namespace>/sweb.eval.x86_64.<id with __ -> _1776_>:latest``.

    ``namespace="swebench"`` names the official images (the eval script activates their ``testbed`` conda env);
    ``namespace="floe"`` the ones ``scorer.images`` builds here from a local base. Either way the repository is the
    image's ``/testbed`` (no ``src/`` input) and the job's input directory is mounted read-only at ``/floe``.

    The container is named per job and removed after it, whatever happened: the ``docker run`` client is only a
    viewer, so the wall-clock limit kills the *container* (``docker rm -f``), not just the client. Before removal its
    state says whether the memory cgroup killed it (``OOMKilled``): ``limits_hit`` names it as the bwrap backend's.
    """

    name = "docker"
    isolation = "docker"

    def __init__(self, docker: str = "docker", namespace: str = "swebench") -> None:
        self.docker = docker
        self.namespace = namespace

    def image_for(self, instance_id: str) -> str:
        return image_name(self.namespace, instance_id)

    def argv(self, job: Job, container: str | None = None) -> list[str]:
        lim = job.limits
        env = [
            x
            for key in ("TZ", "LANG", "PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE")
            for x in ("-e", f"{key}={JOB_ENV[key]}")
        ]
        return [
            self.docker,
            "run",
            "--name",
            container or f"floe-grade-{_container_safe(job.name)}",
            "--label",
            "floe.grading=1",
            "--network",
            "none",
            "--memory",
            str(lim.address_space_bytes),
            # the same value: no swap on top of the memory limit
            "--memory-swap",
            str(lim.address_space_bytes),
            "--pids-limit",
            str(lim.nproc),
            "--ulimit",
            f"cpu={lim.cpu_s}:{lim.cpu_s + 1}",
            "--ulimit",
            f"fsize={lim.fsize_bytes}",
            "--ulimit",
            f"nofile={lim.nofile}",
            "--ulimit",
            "core=0",
            "--security-opt",
            "no-new-privileges",
            "--cap-drop",
            "ALL",
            *env,
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
        if (
            job.image
            and subprocess.run(
                [self.docker, "image", "inspect", job.image], capture_output=True, check=False
            ).returncode
        ):
            # Without this the engine would try a pull and fail with "pull access denied": say what to do instead.
            return ExecResult(
                output=f"image {job.image} is not on this docker engine: build it (floe score images --task-source"
                " SOURCE) or pull the official one",
                returncode=None,
                timed_out=False,
                duration_s=0.0,
                isolation=self.isolation,
            )
        container = f"floe-grade-{_container_safe(job.name)}-{secrets.token_hex(4)}"
        with tempfile.TemporaryDirectory(prefix="floe-docker-") as tmp:
            try:
                res = _execute(self.argv(job, container), job.limits, Path(tmp), self.isolation, env=dict(os.environ))
            finally:
                oom = self._remove(container)
        if oom:
            # The container's memory cgroup killed it: named like the bwrap backend's cgroup limit.
            res.limits_hit = (sandbox.LimitHit("memory", "docker --memory", job.limits.address_space_bytes),)
        return res

    def _remove(self, container: str) -> bool:
        """Remove the job's container (killing it if it still runs); whether the memory cgroup had killed it."""
        inspect = subprocess.run(
            [self.docker, "inspect", "--format", "{{.State.OOMKilled}}", container],
            capture_output=True,
            text=True,
            check=False,
        )
        subprocess.run([self.docker, "rm", "-f", container], capture_output=True, check=False)
        return inspect.stdout.strip() == "true"


def _container_safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "_.-" else "-" for c in name)[:80]


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
while read -r key value; do if [ "$key" = Seccomp: ] && [ "$value" = 2 ]; then echo seccomp_filtered; fi; done \
  </proc/self/status
echo probe_done
"""


def probe_docker(docker: str = "docker") -> ProbeResult:
    """Whether a docker engine answers (the docker backend isolates with its containers; nothing else to probe)."""
    if shutil.which(docker) is None:
        return ProbeResult("C", {"docker_installed": False}, f"docker binary {docker!r} not found")
    res = subprocess.run(
        [docker, "version", "--format", "{{.Server.Version}}"], capture_output=True, text=True, check=False
    )
    if res.returncode != 0:
        detail = (res.stderr.strip().splitlines() or ["no answer"])[-1]
        return ProbeResult(
            "C", {"docker_installed": True, "engine": False}, f"the docker engine does not answer: {detail}"
        )
    return ProbeResult("docker", {"docker_installed": True, "engine": True}, f"docker engine {res.stdout.strip()}")


def probe_bwrap(sandbox: BwrapSandbox, work_dir: Path) -> ProbeResult:
    """Run a probe script through the full recipe and check what isolation actually holds.

    Level A needs every check but ``cgroup_limits``: without cgroups the job still runs isolated, its memory and
    process count capped by rlimits only, and ``detail`` says so (as does the log line)."""
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
        "seccomp_filter": "seccomp_filtered" in out,  # seen from inside: /proc/self/status says "Seccomp: 2"
        "cgroup_limits": res.cgroup is not None,
    }
    level = "A" if all(ok for name, ok in checks.items() if name != "cgroup_limits") else "C"
    if level != "A":
        detail = f"probe failed: {out.strip()[-400:]}"
    else:
        detail = "full bwrap recipe works; seccomp filter in force; " + (
            f"cgroup limits in force ({res.cgroup})"
            if res.cgroup is not None
            else f"no cgroup limits ({res.cgroup_missing}): memory capped by RLIMIT_AS, processes by RLIMIT_NPROC only"
        )
    log.info("sandbox probe", level=level, checks=checks, detail=detail, python=sys.executable)
    return ProbeResult(level, checks, detail)
