"""The ``floe`` command: one entry point for the local broker, topics, replay, services and the demo.

    floe kafka up|down|status|logs      local single-node Kafka (state in .floe/ or $FLOE_HOME or --state-dir)
    floe topics create|list|describe    topics from the contracts registry
    floe replay --topic T [...]         decoded events as JSON lines, or re-published into another topic
    floe serve <service>                run a service (python -m <service>)
    floe demo                           the main job: every service over a local broker, GRPO steps, a report
    floe replay rebuild --builder B …   rebuild trajectories from recorded calls (rollout), no live topics touched
    floe export sft --out FILE          accepted trajectories as chat-format JSONL for supervised fine-tuning
    floe audit                          count over the topics: lost/duplicated trajectories, batches trained twice
    floe <service> …                    that service's own commands (gateway, rollout, scorer, learner,
                                        inference, dashboard, tasks), imported only when used
    floe score validate                 check a task set, each task by its evaluator (also: floe tasks validate)

Kafka address: --bootstrap, else FLOE_KAFKA_BOOTSTRAP_SERVERS, else the broker of `floe kafka up`, else
127.0.0.1:9092.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator

from eventbus import configure_logging
from floe import audit, demo, kafka_cmd, replay_cmd, services_cmd, topics_cmd

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="floe", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--state-dir", default=None, help="state home (default: $FLOE_HOME or .floe/ in the checkout)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    kafka_cmd.add_parser(sub)
    topics_cmd.add_parser(sub)
    replay_cmd.add_parser(sub)
    services_cmd.add_parser(sub)
    demo.add_parser(sub)
    audit.add_parser(sub)
    for name in services_cmd.DELEGATES:
        sub.add_parser(name, help=f"{name} commands (see: floe {name} --help)", add_help=False)
    return parser


def _hoist_state_dir(argv: list[str]) -> list[str]:
    """Accept ``--state-dir`` anywhere (``floe kafka up --state-dir X``) by moving it before the command."""
    rest: list[str] = []
    hoisted: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--state-dir" and i + 1 < len(argv):
            hoisted = ["--state-dir", argv[i + 1]]
            i += 2
            continue
        if arg.startswith("--state-dir="):
            hoisted = [arg]
        else:
            rest.append(arg)
        i += 1
    return hoisted + rest


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Library logs (JSON) go to stderr and only from WARNING: stdout is the command's output.
    configure_logging("floe", level=os.environ.get("FLOE_LOG_LEVEL", "WARNING"))
    # An alias first: it may take over one subcommand of a delegate (`floe tasks validate` is the scorer's).
    alias = services_cmd.resolve_alias(argv)
    if alias is not None:
        return services_cmd.delegate(*alias)
    # Service subcommands are handed over untouched: their own parser owns everything after the name.
    if argv and argv[0] in services_cmd.DELEGATES:
        return services_cmd.delegate(argv[0], argv[1:])
    args = build_parser().parse_args(_hoist_state_dir(argv))
    with _quiet_broken_pipe(args.command):
        return int(args.func(args))


# Commands whose output is a stream to read (`floe replay … | head`): they end quietly on a closed pipe, like any Unix
# filter. Only these, and only while they run: with SIGPIPE at its default a write to any socket the peer closed kills
# the process, and `floe serve`, `floe session run` and `floe demo` run servers and clients in this process (as do
# the tests that call main() in pytest's own process).
_FILTERS = frozenset({"replay", "topics", "audit", "kafka"})


@contextlib.contextmanager
def _quiet_broken_pipe(command: str | None) -> Iterator[None]:
    if command not in _FILTERS or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGPIPE, previous)
