"""Build a ``Grader`` from settings: pick the backend, probe isolation, refuse to run unsandboxed unless allowed."""

from __future__ import annotations

import structlog

from floe_tasks import TaskSet
from scorer.errors import IsolationUnavailable
from scorer.grader import Grader
from scorer.sandbox import BareSandbox, BwrapSandbox, DockerSandbox, ProbeResult, Sandbox, probe_bwrap, probe_docker
from scorer.settings import ScorerSettings
from scorer.testenv import build_testenv

__all__ = ["load_taskset", "make_grader"]

log = structlog.get_logger()


def load_taskset(source: str) -> TaskSet:
    return TaskSet.from_source(source)


def make_grader(settings: ScorerSettings) -> tuple[Grader, ProbeResult]:
    settings.work_dir.mkdir(parents=True, exist_ok=True)
    settings.work_dir.chmod(0o755)
    if settings.backend == "docker":
        probe = probe_docker()
        if probe.level != "docker":
            raise IsolationUnavailable(f"docker backend: {probe.detail}")
        sandbox: Sandbox = DockerSandbox(namespace=settings.docker_namespace)
        testenv = None
    else:
        testenv = build_testenv(settings.work_dir, settings.test_python)
        if settings.backend == "bwrap":
            bwrap = BwrapSandbox(
                ro_paths=testenv.ro_paths(),
                first_uid=settings.first_uid,
                pool_size=settings.workers,
            )
            probe = probe_bwrap(bwrap, settings.work_dir)
            sandbox = bwrap
        else:
            probe = ProbeResult("C", {}, "bare backend configured: no isolation")
            sandbox = BareSandbox()
        if probe.level != "A":
            if not settings.allow_unsandboxed:
                raise IsolationUnavailable(
                    f"no working sandbox ({probe.detail}); refusing to run untrusted code. "
                    "Install bubblewrap, or set FLOE_SCORER_ALLOW_UNSANDBOXED=1 to accept level C."
                )
            log.warning("grading unsandboxed", level=probe.level, detail=probe.detail)
            sandbox = BareSandbox()
    grader = Grader(
        sandbox,
        testenv,
        settings.work_dir,
        settings.limits(),
        max_diff_bytes=settings.max_diff_bytes,
        protect_test_infra=settings.protect_test_infra,
    )
    log.info("grader ready", backend=sandbox.name, isolation=probe.level, workers=settings.workers)
    return grader, probe
