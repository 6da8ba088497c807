"""``floe serve <service>`` and ``floe <service> …``: thin, lazy hand-offs to the service packages.

``serve`` replaces this process with ``python -m <service>`` (same interpreter), so signals and exit codes are the
service's own. ``floe gateway …`` etc. import ``<service>.cli`` only when asked, so the CLI never pays for (or
depends on) a service's heavy imports such as torch.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable

__all__ = ["ALIASES", "DELEGATES", "LEADING_OPTIONS", "SERVICES", "add_parser", "delegate", "resolve_alias"]

SERVICES = ("gateway", "sessions", "rollout", "scorer", "learner", "inference", "dashboard")
# `floe <name> …` -> module whose main(argv) handles the rest of the command line.
DELEGATES = {
    "gateway": "gateway.cli",
    "rollout": "rollout.cli",
    "scorer": "scorer.cli",
    "learner": "learner.cli",
    "inference": "inference.cli",
    "model": "inference.model_cli",
    "dashboard": "dashboard.cli",
    "tasks": "floe_tasks.cli",
    "session": "sessions.cli",
    "score": "scorer.cli",
}

# Commands that read better at the top level, or that moved, but belong to a service: argv prefix -> (delegate,
# argv it gets instead). Aliases are resolved before DELEGATES, so one can take over a delegate's subcommand.
ALIASES: dict[tuple[str, ...], tuple[str, list[str]]] = {
    ("replay", "rebuild"): ("rollout", ["replay-rebuild"]),
    ("export",): ("rollout", ["export"]),
    # Task validation is the scorer's (each evaluator checks its own tasks). `floe tasks` always meant the bundled
    # set unless told otherwise, `floe score` means FLOE_SCORER_TASK_SOURCE: a --source given later still wins.
    ("tasks", "validate"): ("score", ["validate", "--source", "bundled"]),
}
# Options (each with a value) that a delegate takes before its subcommand: an alias still matches past them
# (`floe tasks --source X validate`), and they are handed on after the replacement.
LEADING_OPTIONS: dict[str, frozenset[str]] = {"tasks": frozenset({"--task-source", "--source"})}


def resolve_alias(argv: list[str]) -> tuple[str, list[str]] | None:
    argv, lifted = _lift_leading_options(argv)
    for prefix, (name, replacement) in ALIASES.items():
        if tuple(argv[: len(prefix)]) == prefix:
            return name, [*replacement, *lifted, *argv[len(prefix) :]]
    return None


def _lift_leading_options(argv: list[str]) -> tuple[list[str], list[str]]:
    """``[cmd, --opt, v, sub, …]`` -> ``([cmd, sub, …], [--opt, v])`` for the options ``LEADING_OPTIONS`` names."""
    names = LEADING_OPTIONS.get(argv[0], frozenset()) if argv else frozenset()
    lifted: list[str] = []
    i = 1
    while i < len(argv):
        if argv[i] in names and i + 1 < len(argv):
            lifted += argv[i : i + 2]
            i += 2
        elif argv[i].split("=", 1)[0] in names and "=" in argv[i]:
            lifted.append(argv[i])
            i += 1
        else:
            break
    return [*argv[:1], *argv[i:]], lifted


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("serve", help="run a service in the foreground (python -m <service>)")
    p.add_argument("service", choices=SERVICES)
    p.add_argument("service_args", nargs=argparse.REMAINDER, help="passed to the service")
    p.set_defaults(func=serve)


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # the parent package is missing
        return False


def serve(args: argparse.Namespace) -> int:
    module = args.service
    if not (_module_exists(module) and _module_exists(f"{module}.__main__")):
        print(
            f"floe serve: service {module!r} is not runnable here (no {module}.__main__); "
            f"install it with: uv sync --all-packages",
            file=sys.stderr,
        )
        return 2
    argv = [sys.executable, "-m", module, *args.service_args]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, argv)
    return 0  # not reached


def delegate(name: str, argv: list[str]) -> int:
    module_name = DELEGATES[name]
    if not _module_exists(module_name):
        print(
            f"floe {name}: this command needs {module_name} (package {module_name.split('.')[0]}), which is not "
            f"installed or has no command line yet",
            file=sys.stderr,
        )
        return 2
    module = importlib.import_module(module_name)
    main: Callable[[list[str] | None], int] | None = getattr(module, "main", None)
    if main is None:
        print(f"floe {name}: {module_name} has no main(argv) function", file=sys.stderr)
        return 2
    return int(main(argv) or 0)
