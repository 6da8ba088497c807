"""``floe session run``: run one session on this machine and show what happened.

    floe session run --harness pi --task <id> [--task-source bundled|tasks.jsonl] [--engine-url URL]

Starts an in-process gateway (on a free loopback port, pointing at ``--engine-url``, the inference engine) and the
session runner, submits one ``SessionRequested``, and prints each state transition as it happens, then the diff,
the harness output tails and the recorded model calls. Nothing goes to Kafka: the calls are captured in memory.
This is the tool to reach for when a harness misbehaves. Needs root (the sandbox drops to an unprivileged uid),
bubblewrap, and the harness CLIs (``deploy/harnesses/install.sh``).

Hook: ``floe session …`` -> ``sessions.cli.session_main(argv)``. The in-process proxy comes from
``sessions.gateway_node.local_gateway``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any, TextIO

from contracts import (
    ModelCallRecorded,
    SessionFinished,
    SessionRequested,
    SessionState,
    SessionStateChanged,
    new_group_id,
    new_session_id,
)
from floe_tasks import NAMED_SETS

__all__ = ["main", "session_main"]


class _Printer:
    """EventSink for the runner (states, result) and for the gateway's recorder (model calls)."""

    def __init__(self, out: TextIO, *, as_json: bool) -> None:
        self.out = out
        self.as_json = as_json
        self.calls: list[ModelCallRecorded] = []
        self.result: SessionFinished | None = None

    async def state(self, event: SessionStateChanged) -> None:
        if self.as_json:
            print(event.model_dump_json(), file=self.out, flush=True)
        else:
            reason = f"  ({event.reason})" if event.reason else ""
            print(f"[{event.seq}] {event.state.value}{reason}", file=self.out, flush=True)

    async def finished(self, event: SessionFinished) -> None:
        self.result = event

    async def send(self, topic: Any, event: Any) -> None:  # the gateway recorder's sink
        if isinstance(event, ModelCallRecorded):
            self.calls.append(event)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="floe session", description="run agent sessions locally")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run one session and print its transitions, diff and recorded calls")
    run.add_argument("--harness", required=True, help="preset name (services/sessions/presets/<name>.toml)")
    run.add_argument("--task", required=True, help="task instance id")
    run.add_argument("--task-source", default="bundled", help="'bundled' or a SWE-bench JSONL path")
    run.add_argument(
        "--engine-url",
        default=os.environ.get("FLOE_ENGINE_URL", "http://127.0.0.1:8100"),
        help="the inference engine the session's gateway forwards to (env FLOE_ENGINE_URL; default "
        "http://127.0.0.1:8100, where `floe serve inference` listens)",
    )
    run.add_argument("--model", default="floe-policy", help="model name presented to the harness")
    run.add_argument("--command", default=None, help="shell line for the generic 'command' preset")
    run.add_argument("--agent-timeout", type=float, default=600.0)
    run.add_argument("--session-timeout", type=float, default=1800.0)
    run.add_argument("--tokenization", choices=["exact", "canonical"], default="exact")
    run.add_argument("--json", action="store_true", help="print events as JSON lines")
    sub.add_parser("presets", help="list the harness presets")
    return parser


def session_main(argv: list[str] | None = None, out: TextIO | None = None) -> int:
    args = _parser().parse_args(argv)
    out = out or sys.stdout
    from sessions.settings import SessionSettings

    settings = SessionSettings()
    if args.command == "presets":
        from sessions.presets import PresetError, load_preset

        for file in sorted(settings.presets_dir.glob("*.toml")):
            try:
                preset = load_preset(settings.presets_dir, file.stem)
                print(f"{preset.name:16} {preset.protocol:20} {preset.description}", file=out)
            except PresetError as exc:
                print(f"{file.stem:16} INVALID: {exc}", file=out)
        return 0
    problem = _engine_problem(args.engine_url)
    if problem is not None:
        print(problem, file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("floe session run needs root: the sandbox drops to another uid (setpriv + bwrap)", file=sys.stderr)
        return 2
    return asyncio.run(_run(args, settings, out))


def _engine_problem(url: str) -> str | None:
    """Why the engine at ``url`` cannot serve a session, in words that say what to do; None when it answers.

    Without this, a session against no engine ends FAILED "harness pi exited with code 1" after the harness's own
    retries, the gateway's 503 buried in its stderr tail."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url.rstrip("/") + "/v1/models", timeout=5):
            return None
    except urllib.error.HTTPError as exc:
        if exc.code < 500:
            return None  # it answers HTTP (a proxy in front may refuse the listing): let the gateway's checks speak
        reason = f"answers {exc.code} {exc.reason}"
    except (urllib.error.URLError, OSError) as exc:
        reason = f"does not answer ({getattr(exc, 'reason', exc)})"
    return (
        f"floe session run: no inference engine at {url}: it {reason}.\n"
        "Start one, e.g. `floe serve inference` (the CPU engine on 127.0.0.1:8100; `--model smollm2-135m` for the real "
        "model) or `floe serve inference --engine vllm`, or point --engine-url (FLOE_ENGINE_URL) at yours."
    )


async def _run(args: argparse.Namespace, settings: Any, out: TextIO) -> int:
    from sessions.gateway_node import local_gateway

    printer = _Printer(out, as_json=args.json)
    async with contextlib.AsyncExitStack() as stack:
        try:
            link = await stack.enter_async_context(local_gateway(args.engine_url, printer))
        except RuntimeError as exc:
            print(str(exc), file=sys.stderr)
            return 1
        result = await _run_one(args, settings, link, printer, out)
    _report(result, printer.calls, out, as_json=args.json)
    return 0 if result.status is SessionState.DONE else 1


async def _run_one(
    args: argparse.Namespace, settings: Any, link: Any, printer: _Printer, out: TextIO
) -> SessionFinished:
    from sessions.node import SessionNode

    node = SessionNode(settings, kafka=None, gateway=link)  # type: ignore[arg-type]
    node.start_local(printer)
    request = SessionRequested(
        session_id=new_session_id(),
        group_id=new_group_id(),
        task_id=args.task,
        task_source=args.task_source if args.task_source in NAMED_SETS else str(Path(args.task_source).resolve()),
        harness=args.harness,
        model=args.model,
        agent_timeout_s=args.agent_timeout,
        session_timeout_s=args.session_timeout,
        tokenization=args.tokenization,
        metadata={"command": args.command} if args.command else {},
    )
    host, port = link.address
    print(
        f"session {request.session_id}: {args.harness} on {args.task_source}:{args.task} (gateway http://{host}:{port})",
        file=out,
    )
    try:
        await node.submit(request)
        return await node.wait_finished(request.session_id, timeout=args.session_timeout + 60)
    finally:
        await node.shutdown()


def _report(result: SessionFinished, calls: list[ModelCallRecorded], out: TextIO, *, as_json: bool) -> None:
    if as_json:
        print(result.model_dump_json(), file=out)
        for call in calls:
            print(call.model_dump_json(exclude={"request"}), file=out)
        return
    print(f"\n== {result.status.value}" + (f": {result.reason}" if result.reason else ""), file=out)
    print(f"exit code {result.exit_code}; calls {result.calls}; timings {json.dumps(result.timings_ms)}", file=out)
    print(f"\n== diff ({len(result.diff)} chars)\n{result.diff}", file=out)
    print(f"== stdout tail\n{result.stdout_tail[-2000:]}\n== stderr tail\n{result.stderr_tail[-2000:]}", file=out)
    print(f"== recorded calls ({len(calls)})", file=out)
    for call in calls:
        print(
            f"  #{call.call_index} {call.protocol.value} prompt={call.prompt_len} tokens "
            f"(prefix {call.prefix_len} from call {call.prefix_call_index}) completion={len(call.completion_token_ids)}"
            f" finish={call.finish_reason} weights=v{call.weight_version} changes={call.gateway_changes}",
            file=out,
        )


def main(argv: list[str] | None = None) -> int:
    """``floe session …`` through the floe CLI's delegate table (``"session": "sessions.cli"``)."""
    return session_main(argv)
