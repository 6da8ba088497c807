"""Scorer settings (env prefix ``FLOE_SCORER_``), built once in ``__main__``/``cli`` and passed down."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from scorer.sandbox import Limits

__all__ = ["ScorerSettings"]


class ScorerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FLOE_SCORER_", extra="forbid")

    backend: Literal["bwrap", "docker", "bare"] = "bwrap"
    docker_namespace: str = Field(
        default="swebench",
        description="docker backend: the images' namespace, 'swebench' (official) or 'floe' (`floe score images`)",
    )
    allow_unsandboxed: bool = Field(
        default=False, description="run untrusted diffs without isolation when bwrap does not work (level C)"
    )
    workers: int = Field(default=2, ge=1, le=64, description="concurrent graders")
    work_dir: Path = Path("/var/tmp/floe-scorer")
    test_python: str | None = None
    first_uid: int = 61000
    task_source: str = Field(default="bundled", description="'bundled' or a path to a SWE-bench JSONL")
    consumer_group: str = "scorer"
    transactional_id: str | None = Field(default=None, description="stable per instance; default scorer-<hostname>")
    validate_on_start: bool = Field(default=False, description="grade gold/empty/test-patch for every task first")
    protect_test_infra: bool = True
    max_diff_bytes: int = 2 * 1024 * 1024
    # limits per grading job
    timeout_s: float = Field(default=300.0, gt=0, description="wall-clock limit per instance")
    cpu_s: int = 120
    memory_bytes: int = Field(
        default=2 * 1024**3, description="memory of a whole job (cgroup: RAM + swap, its tmpfs pages included)"
    )
    address_space_bytes: int | None = Field(
        default=None,
        description="RLIMIT_AS per process (default twice memory_bytes: a backstop that leaves the cgroup to fire)",
    )
    nproc: int = Field(default=256, description="processes and threads of a job (cgroup pids.max, RLIMIT_NPROC)")
    fsize_bytes: int = 64 * 1024**2
    testbed_bytes: int = 256 * 1024**2

    def limits(self) -> Limits:
        return Limits(
            cpu_s=self.cpu_s,
            memory_bytes=self.memory_bytes,
            address_space_bytes=self.address_space_bytes or 2 * self.memory_bytes,
            nproc=self.nproc,
            fsize_bytes=self.fsize_bytes,
            testbed_bytes=self.testbed_bytes,
            wall_s=self.timeout_s,
        )
