"""Settings of the session runner (env prefix ``FLOE_GATEWAY_SESSIONS_``).

The runner is the second job of a gateway node (the first is the model-API proxy). Everything that shapes a session
on this node is here: where workspaces live, how many sessions prepare and run at once, the READY pool's size and
look-ahead, the sandbox's uid and resource limits, and where the harness CLIs are installed.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["SessionSettings", "default_harness_home"]


def default_harness_home() -> Path:
    # Same default as deploy/harnesses/install.sh. The sandbox uid must be able to reach the CLIs by path, and
    # root's HOME (/root, mode 0700) is not traversable, so a node running as root (it must, to drop to the agent
    # uid) defaults to /var/cache/floe; anyone else to ~/.cache/floe.
    if os.environ.get("FLOE_HARNESS_HOME"):
        return Path(os.environ["FLOE_HARNESS_HOME"])
    default_cache = "/var/cache/floe" if os.geteuid() == 0 else str(Path.home() / ".cache" / "floe")
    return Path(os.environ.get("FLOE_CACHE") or default_cache) / "harnesses"


def _default_presets_dir() -> Path:
    # services/sessions/presets, next to the package's src/ in a source checkout.
    return Path(__file__).resolve().parents[2] / "presets"


class SessionSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FLOE_GATEWAY_SESSIONS_", extra="forbid")

    node_id: str = Field(default_factory=socket.gethostname)
    work_root: Path = Field(default=Path("/tmp/floe-sessions"), description="session and pool directories")
    presets_dir: Path = Field(default_factory=_default_presets_dir)
    harness_home: Path = Field(default_factory=default_harness_home)

    # Capacity: PREPARING and RUNNING are separate pools (Polar's init/run workers).
    max_preparing: int = Field(default=4, ge=1)
    max_running: int = Field(default=4, ge=1)

    # READY pool: up to ``pool_max_per_task`` prepared workspaces per task ahead of demand; a task with demand in
    # the last ``pool_demand_ttl_s`` keeps ``pool_lookahead`` spares beyond the sessions waiting for it.
    pool_max_per_task: int = Field(default=8, ge=0)
    pool_lookahead: int = Field(default=2, ge=0)
    pool_max_total: int = Field(default=64, ge=0)
    pool_demand_ttl_s: float = Field(default=600.0, gt=0)
    pool_idle_ttl_s: float = Field(default=1800.0, gt=0)
    pool_warm_tasks: list[str] = Field(default_factory=list, description="'source:task_id' prepared at start")

    prepare_step_timeout_s: float = Field(default=600.0, gt=0)
    prepare_network: bool = Field(default=True, description="prepare steps may reach package registries")

    # Sandbox.
    agent_uid: int = Field(default=10_001, ge=1)
    agent_gid: int = Field(default=10_001, ge=1)
    sandbox_workspace: str = "/workspace"
    sandbox_home: str = "/home/agent"
    inner_gateway_port: int = Field(default=18_080, ge=1024, le=65_535)
    bridge_python: Path = Field(
        default=Path("/usr/bin/python3"), description="runs the in-sandbox launcher (lifeline, TCP->UDS bridge)"
    )
    rlimit_nofile: int = Field(default=4096, ge=64)
    rlimit_nproc: int = Field(default=4096, ge=16)
    rlimit_fsize_mb: int = Field(default=2048, ge=1, description="largest file the harness may write")
    rlimit_as_mb: int | None = Field(default=None, description="address space; off: node and Bun reserve a lot")
    tmp_size_mb: int = Field(default=1024, ge=1)
    # Whole-sandbox caps through a cgroup of the session's own (sandbox.cgroup), where the machine has the
    # controllers: an agent's fork bomb or runaway test must end its own session, not take the node with it.
    memory_mb: int | None = Field(
        default=4096, ge=16, description="RAM + swap + tmpfs pages of the whole session sandbox; None: off"
    )
    pids: int | None = Field(default=1024, ge=16, description="processes + threads of the whole session; None: off")

    # Output capture: only the tail is kept, however much the harness prints.
    output_tail_bytes: int = Field(default=64 * 1024, ge=1024)
    max_diff_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    kill_grace_s: float = Field(default=2.0, ge=0)
    seen_sessions_max: int = Field(default=100_000, ge=100)
