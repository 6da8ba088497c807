"""The command line of a service's entry point (``python -m <service>``, ``floe serve <service>``).

Every service reads its settings from the environment (``FLOE_<SERVICE>_*``, ``FLOE_KAFKA_*``). Its entry point
also takes flags for the main ones, so a user starting one service by hand has a real ``--help``, flags that win
over the environment, and a clear error for a flag it does not know (argparse: exit 2), instead of a server that
starts anyway and ignores what it was told.

A flag is applied by setting the variable it stands for before the service reads any settings. That way it reaches
every settings object the service builds (several build ``KafkaSettings()`` where they need it) and every child
process it starts (the vLLM launcher), exactly as the variable would; ``--help`` names the variable of each flag.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["BROKER", "Flag", "http_flags", "list_flag", "parse_service_args"]


@dataclass(frozen=True)
class Flag:
    """``--name VALUE`` sets the environment variable ``env`` (``to_env`` renders the parsed value)."""

    name: str
    env: str
    help: str
    type: Callable[[str], Any] = str
    metavar: str | None = None
    to_env: Callable[[Any], str] = str
    many: bool = False  # may be given more than once; the values arrive as a list


BROKER = Flag(
    "--broker", "FLOE_KAFKA_BOOTSTRAP_SERVERS", "Kafka bootstrap servers (host:port[,host:port...])", metavar="ADDR"
)


def http_flags(prefix: str, host_var: str = "HOST", port_var: str = "PORT") -> list[Flag]:
    """``--host`` and ``--port`` for a service whose settings are ``<prefix>HOST`` and ``<prefix>PORT``."""
    return [
        Flag("--host", prefix + host_var, "address to listen on", metavar="ADDR"),
        Flag("--port", prefix + port_var, "port to listen on", type=int, metavar="N"),
    ]


def list_flag(name: str, env: str, help: str, metavar: str) -> Flag:
    """A flag given once or more whose variable holds a JSON list (pydantic-settings reads lists as JSON)."""
    return Flag(name, env, help + " (repeat for several)", metavar=metavar, to_env=json.dumps, many=True)


def parse_service_args(
    prog: str,
    description: str,
    flags: Sequence[Flag],
    argv: Sequence[str] | None = None,
    *,
    epilog: str | None = None,
    parser: argparse.ArgumentParser | None = None,
) -> argparse.Namespace:
    """Parse ``argv`` (``--help`` prints and exits 0, an unknown flag exits 2), then export the flags given.

    ``parser``: a parser with the service's own arguments already added (they are parsed, not exported)."""
    parser = parser or argparse.ArgumentParser(prog=prog, description=description, epilog=epilog)
    dests: list[tuple[str, Flag]] = []
    for flag in flags:
        dest = flag.name.lstrip("-").replace("-", "_")
        parser.add_argument(
            flag.name,
            dest=dest,
            type=flag.type,
            metavar=flag.metavar,
            default=None,
            action="append" if flag.many else "store",
            help=f"{flag.help} (overrides {flag.env})",
        )
        dests.append((dest, flag))
    args = parser.parse_args(argv)
    for dest, flag in dests:
        value = getattr(args, dest)
        if value is not None:
            os.environ[flag.env] = flag.to_env(value)
    return args
