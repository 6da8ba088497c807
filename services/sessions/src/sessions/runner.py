"""Run one session end to end: PREPARING -> READY -> RUNNING -> FINISHING -> DONE | FAILED | TIMEOUT | CANCELLED.

``SessionRunner.run`` never raises for a session's own failure: failures are terminal states with a reason
(style #17). It always cleans up, before the terminal state is published, so a consumer that sees DONE can rely on
it: the harness's process tree is gone (pid namespace torn down), the bridge socket and the gateway session are
closed, and the session's directories (HOME, run dir, workspace) are deleted.

Time budgets (docs/polar-comparison.md, "Time budgets"): ``session_timeout_s`` runs from acceptance on this node and
covers every stage, ending the session TIMEOUT wherever it is (no diff). ``agent_timeout_s`` starts when the harness
starts; when it runs out the harness is killed, the diff is still collected, and the session ends TIMEOUT with
``agent_timed_out=True`` (a trainable negative, unlike an infrastructure TIMEOUT).

Exit status (``exit_code`` is always reported):
- a code in the preset's ``success_exit_codes`` ends DONE;
- death by a signal (bwrap reports 128+N) ends FAILED "harness crashed";
- any other code ends DONE (with the code in ``reason``) if the gateway served at least one call and none failed:
  the agent ended on its own after a clean conversation, e.g. Codex exits 1 when the policy's answer hit the token
  limit. That is the policy's doing, a trainable negative, and must not be masked as an infrastructure failure;
- otherwise FAILED "harness exited with code N" (no model call at all, or the gateway failed calls: ours), followed
  by the gateway's error for the last refused call when there was one (e.g. ``context_overflow: prompt is too long:
  10895 tokens > 8192 maximum context length``).
The diff and output tails are collected in every case where the harness ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import string
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import structlog

from contracts import PROVIDERS, SessionFinished, SessionRequested, SessionState, SessionStateChanged
from sandbox import SandboxError, SandboxProcess
from sessions.launch import find_cli, session_spec
from sessions.metrics import SessionMetrics
from sessions.presets import Preset, PresetError, load_preset, render
from sessions.ready_pool import PriorityGate, ReadyPool
from sessions.settings import SessionSettings
from sessions.states import Lifecycle
from sessions.workspace import PreparedWorkspace, TaskResolver, WorkspaceError, collect_diff, remove_tree

__all__ = ["EventSink", "SessionGateway", "SessionRunner", "SessionStats"]

log = structlog.get_logger()


@dataclass(frozen=True)
class SessionStats:
    calls: int = 0  # calls served and recorded: SessionFinished.calls, the records the rollout waits for
    turns: int = 0  # calls served and recorded (harnesses without a turn notion: the same as calls)
    failed: int = 0  # calls the gateway could not serve (engine down, bad request, ...)
    last_error: str | None = None  # the gateway's error for the last of them, "<kind>: <message>"
    unrecorded: dict[str, int] = field(default_factory=dict)  # why calls ended without a record -> how many


class SessionGateway(Protocol):
    """What the runner needs from this node's model-API proxy (``sessions.gateway_node.RegistryGateway``)."""

    @property
    def address(self) -> tuple[str, int]:
        """The proxy's TCP (host, port) that the bridge forwards to."""
        ...

    def open(self, request: SessionRequested) -> str:
        """Register the session; return its token (the harness's API key)."""
        ...

    def stats(self, session_id: str) -> SessionStats: ...

    def close(self, session_id: str) -> None:
        """Later calls with the token are refused."""
        ...


class EventSink(Protocol):
    async def state(self, event: SessionStateChanged) -> None: ...

    async def finished(self, event: SessionFinished) -> None: ...


@dataclass
class _Run:
    """Everything one session holds, so cleanup can release exactly that."""

    request: SessionRequested
    lifecycle: Lifecycle
    accepted_at: float
    session_dir: Path | None = None
    workspace: PreparedWorkspace | None = None
    preset: Preset | None = None
    process: SandboxProcess | None = None  # owns the bridge to the gateway too
    gateway_open: bool = False
    pool_hit: bool = False
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    diff: str = ""
    agent_timed_out: bool = False
    limit: str | None = None  # the sandbox limit that fired, for a person ("memory limit (cgroup, 4.0 GiB)")
    cancel_reason: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    marks: dict[str, float] = field(default_factory=dict)

    def mark(self, name: str) -> None:
        self.marks[name] = time.monotonic()

    def span(self, start: str, end: str) -> float | None:
        if start in self.marks and end in self.marks:
            return (self.marks[end] - self.marks[start]) * 1000.0
        return None


class SessionRunner:
    def __init__(
        self,
        settings: SessionSettings,
        *,
        gateway: SessionGateway,
        sink: EventSink,
        pool: ReadyPool,
        run_gate: PriorityGate,
        tasks: TaskResolver,
        metrics: SessionMetrics,
    ) -> None:
        self.settings = settings
        self.gateway = gateway
        self.sink = sink
        self.pool = pool
        self.run_gate = run_gate
        self.tasks = tasks
        self.metrics = metrics

    # ---------------------------------------------------------------------------------------------- public

    async def accept(self, request: SessionRequested) -> Lifecycle:
        """Publish REQUESTED (durably, before the request's offset is committed) and return the lifecycle."""
        lifecycle = Lifecycle(request, self.settings.node_id)
        await self.sink.state(lifecycle.to(SessionState.REQUESTED))
        return lifecycle

    async def run(self, lifecycle: Lifecycle, cancel_reason: list[str] | None = None) -> SessionFinished:
        """Drive an accepted session to its end. ``cancel_reason`` is filled by whoever cancels the task that runs
        this coroutine (the node), so a cancellation is told apart from a shutdown."""
        request = lifecycle.request
        run = _Run(request=request, lifecycle=lifecycle, accepted_at=time.monotonic())
        run.mark("accepted")
        structlog.contextvars.bind_contextvars(session_id=request.session_id, group_id=request.group_id)
        self.metrics.active.inc()
        status: SessionState = SessionState.FAILED
        reason: str | None = "unknown"
        shutdown = False
        deadline = asyncio.timeout(request.session_timeout_s)
        try:
            async with deadline:
                status, reason = await self._stages(run)
        except TimeoutError:
            if deadline.expired():
                status, reason = SessionState.TIMEOUT, f"session deadline of {request.session_timeout_s:g}s exceeded"
            else:
                status, reason = SessionState.FAILED, "internal timeout"
                log.exception("session internal timeout")
        except asyncio.CancelledError:
            if cancel_reason:
                status, reason = SessionState.CANCELLED, cancel_reason[0]
            else:
                status, reason, shutdown = SessionState.FAILED, "node shutting down", True
        except (PresetError, WorkspaceError, SandboxError) as exc:
            status, reason = SessionState.FAILED, str(exc)
        except Exception as exc:
            log.exception("session failed unexpectedly")
            status, reason = SessionState.FAILED, f"internal error: {type(exc).__name__}: {exc}"
        run.mark("ending")
        await self._cleanup(run)
        run.mark("cleaned")
        finished = self._finished(run, status, reason)
        await self._publish_end(run, status, reason, finished)
        self.metrics.active.dec()
        self.metrics.sessions.labels(status.value).inc()
        log.info("session finished", state=status.value, reason=reason, timings=finished.timings_ms)
        structlog.contextvars.unbind_contextvars("session_id", "group_id")
        if shutdown:
            raise asyncio.CancelledError
        return finished

    # ---------------------------------------------------------------------------------------------- stages

    async def _stages(self, run: _Run) -> tuple[SessionState, str | None]:
        request, lc = run.request, run.lifecycle
        await self.sink.state(lc.to(SessionState.PREPARING))
        run.mark("preparing")
        preset = run.preset = load_preset(self.settings.presets_dir, request.harness)
        path = [string.Template(p).safe_substitute(harness_home=str(self.settings.harness_home)) for p in preset.path]
        if find_cli(preset.cli, path) is None:
            raise PresetError(
                f"harness CLI {preset.cli!r} for preset {preset.name!r} is not installed "
                f"(run deploy/harnesses/install.sh; looked in {', '.join(path)})"
            )
        task = self.tasks.resolve(request.task_source, request.task_id)
        key = f"{request.task_source}:{request.task_id}"
        run.workspace, run.pool_hit = await self.pool.acquire(key, task, request.priority)
        run.timings["prepare_ms"] = 0.0 if run.pool_hit else run.workspace.prepare_ms
        await self.sink.state(lc.to(SessionState.READY))
        run.mark("ready")

        async with self.run_gate.slot(request.priority):
            run.mark("slot")
            self.metrics.ready_wait_seconds.observe(run.marks["slot"] - run.marks["ready"])
            await self._start_harness(run, task.problem_statement)
            await self.sink.state(lc.to(SessionState.RUNNING))
            run.mark("running")
            self.metrics.start_latency_seconds.observe(run.marks["running"] - run.marks["accepted"])
            self.metrics.running.inc()
            try:
                await self._wait_harness(run)
            finally:
                self.metrics.running.dec()
            run.mark("agent_done")

        await self.sink.state(lc.to(SessionState.FINISHING))
        run.mark("finishing")
        assert run.session_dir is not None and run.workspace is not None
        run.diff = await collect_diff(
            self.settings, run.workspace, run.session_dir / "home", run.session_dir / "run", preset.diff_exclude
        )
        run.mark("diffed")
        if run.agent_timed_out:
            return SessionState.TIMEOUT, f"agent time budget of {request.agent_timeout_s:g}s exceeded"
        stats = self._stats(run)
        code = run.exit_code
        if code in preset.success_exit_codes:
            return SessionState.DONE, None
        fired = f"; the {run.limit} fired" if run.limit else ""
        if code is not None and (code < 0 or code > 128):
            signum = -code if code < 0 else code - 128
            return SessionState.FAILED, f"harness {preset.name} crashed (signal {signum}){fired}"
        if stats.turns > 0 and stats.failed == 0:
            return SessionState.DONE, f"harness {preset.name} exited with code {code} after {stats.turns} clean call(s)"
        reason = f"harness {preset.name} exited with code {code}{fired}"
        if stats.failed:
            # Say why the gateway refused calls: e.g. a prompt longer than the model's context is no harness bug.
            reason += f"; the gateway refused {stats.failed} call(s), the last: {stats.last_error or 'unknown error'}"
        return SessionState.FAILED, reason

    def _stats(self, run: _Run) -> SessionStats:
        try:
            stats = self.gateway.stats(run.request.session_id)
        except Exception:
            log.exception("gateway stats failed")
            return SessionStats()
        run.timings["calls"] = float(stats.calls)
        run.timings["turns"] = float(stats.turns)
        run.timings["failed_calls"] = float(stats.failed)
        for why, n in stats.unrecorded.items():
            run.timings[f"unrecorded:{why}"] = float(n)
        return stats

    async def _start_harness(self, run: _Run, prompt: str) -> None:
        s, request, preset, ws = self.settings, run.request, run.preset, run.workspace
        assert preset is not None and ws is not None
        # Never the raw session id in a path: it comes off the wire.
        session_dir = run.session_dir = s.work_root / "sessions" / secrets.token_hex(8)
        home, run_dir = session_dir / "home", session_dir / "run"
        session_dir.mkdir(parents=True)
        os.chmod(session_dir, 0o711)
        home.mkdir(mode=0o700)
        run_dir.mkdir()
        os.chmod(run_dir, 0o755)
        os.chown(home, s.agent_uid, s.agent_gid)

        token = self.gateway.open(request)
        run.gateway_open = True

        gateway_url = f"http://127.0.0.1:{s.inner_gateway_port}"
        variables = {
            "session_id": request.session_id,
            "task_id": request.task_id,
            "token": token,
            "model": request.model,
            "gateway_url": gateway_url,
            **{p.template_var: p.base_url(gateway_url) for p in PROVIDERS},  # ${openai_base_url}, ...
            "prompt": prompt,
            "prompt_file": f"{s.sandbox_home}/.floe-prompt.md",
            "workspace": s.sandbox_workspace,
            "home": s.sandbox_home,
            "harness_home": str(s.harness_home),
        }
        rendered = render(preset, variables, request.metadata)
        files = {**rendered.files, variables["prompt_file"]: (prompt, 0o600)}
        for sandbox_path, (content, mode) in files.items():
            host_path = home / Path(sandbox_path).relative_to(s.sandbox_home)
            _write_private(host_path, home, content, mode, s.agent_uid, s.agent_gid)

        spec = session_spec(
            s,
            rendered.argv,
            workspace=ws.repo,
            home=home,
            run_dir=run_dir,
            env={**rendered.env, "FLOE_SESSION_ID": request.session_id},
            path_prepend=rendered.path_prepend,
            network="none",
            gateway=self.gateway.address,
        )
        run.process = SandboxProcess(spec)
        await run.process.start()
        if run.process.ns_init_pid is None:
            code = await run.process.wait(timeout=10.0)
            raise SandboxError(f"sandbox failed to start (exit {code}): {run.process.stderr.text()[-500:]}")

    async def _wait_harness(self, run: _Run) -> None:
        proc = run.process
        assert proc is not None
        started = run.marks.get("slot", time.monotonic())
        budget = run.request.agent_timeout_s - (time.monotonic() - started)
        try:
            run.exit_code = await proc.wait(timeout=max(budget, 0.001))
        except TimeoutError:
            run.agent_timed_out = True
            await proc.kill()
        await proc.kill()  # the harness may have left children behind: tear the namespace down now
        # After the kill: the cgroup's counters (an OOM kill, a refused fork) are read when the sandbox is torn down.
        result = proc.result(run.exit_code)
        run.stdout, run.stderr = result.stdout_text, result.stderr_text
        run.limit = result.limits_hit[0].describe() if result.limits_hit else None

    # --------------------------------------------------------------------------------------------- cleanup

    async def _cleanup(self, run: _Run) -> None:
        """Release everything the session holds. Each step is independent: one failing never skips the others."""
        if run.process is not None:
            with contextlib.suppress(Exception):
                if run.process.pid is not None and not run.stdout and not run.stderr:
                    result = run.process.result(run.exit_code)
                    run.stdout, run.stderr = result.stdout_text, result.stderr_text
                await run.process.kill()  # and closes its bridge
                if not await run.process.wait_gone():
                    log.error("sandbox outlived its kill", pid=run.process.ns_init_pid)
        if run.gateway_open:
            self._stats(run)
            with contextlib.suppress(Exception):
                self.gateway.close(run.request.session_id)
        for path in (run.session_dir, run.workspace.root if run.workspace else None):
            if path is not None:
                try:
                    await asyncio.to_thread(remove_tree, path)
                except Exception:
                    log.exception("session cleanup failed", path=str(path))

    # ---------------------------------------------------------------------------------------------- events

    def _finished(self, run: _Run, status: SessionState, reason: str | None) -> SessionFinished:
        request = run.request
        timings: dict[str, float] = {"prepare_ms": run.timings.get("prepare_ms", 0.0), "pool_hit": float(run.pool_hit)}
        if run.timings.get("failed_calls"):  # calls the gateway could not serve: no record on the calls topic
            timings["failed_calls"] = run.timings["failed_calls"]
            # ... and why, per reason ("unrecorded:<gateway error kind>", "unrecorded:client_disconnected", ...)
            timings.update({k: v for k, v in run.timings.items() if k.startswith("unrecorded:")})
        spans = {
            "acquire_ms": ("preparing", "ready"),
            "ready_wait_ms": ("ready", "slot"),
            "start_latency_ms": ("accepted", "running"),
            "agent_ms": ("running", "agent_done"),
            "diff_ms": ("finishing", "diffed"),
            "cleanup_ms": ("ending", "cleaned"),
            "total_ms": ("accepted", "cleaned"),
        }
        for name, (a, b) in spans.items():
            value = run.span(a, b)
            if value is not None:
                timings[name] = round(value, 3)
        calls = int(run.timings.get("calls", 0))
        return SessionFinished(
            session_id=request.session_id,
            group_id=request.group_id,
            task_id=request.task_id,
            task_source=request.task_source,
            harness=request.harness,
            node_id=self.settings.node_id,
            status=status,
            reason=reason,
            diff=run.diff,
            exit_code=run.exit_code,
            agent_timed_out=run.agent_timed_out,
            stdout_tail=run.stdout[-8192:],
            stderr_tail=run.stderr[-8192:],
            turns=int(run.timings.get("turns", calls)),
            calls=calls,
            timings_ms=timings,
        )

    async def _publish_end(
        self, run: _Run, status: SessionState, reason: str | None, finished: SessionFinished
    ) -> None:
        # Terminal state first, then the result: a consumer that sees SessionFinished also has the final state.
        event = run.lifecycle.to(status, reason) if not run.lifecycle.terminal else None
        state_sent = event is None
        for attempt in range(3):
            try:
                if not state_sent and event is not None:
                    await self.sink.state(event)
                    state_sent = True
                await self.sink.finished(finished)
                return
            except Exception:
                log.exception("publishing the session end failed", attempt=attempt)
                await asyncio.sleep(0.5 * (attempt + 1))


def _write_private(path: Path, home: Path, content: str, mode: int, uid: int, gid: int) -> None:
    """Write a config file into the harness HOME, owned by the sandbox uid (dirs created on the way too)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    parent = path.parent
    while parent != home and home in parent.parents:
        os.chown(parent, uid, gid)
        parent = parent.parent
    path.write_text(content)
    os.chmod(path, mode)
    os.chown(path, uid, gid)
