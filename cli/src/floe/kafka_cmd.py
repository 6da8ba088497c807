"""``floe kafka up|down|status|logs``: the local single-node broker (``deploy/kafka/kafka.sh``), idempotent.

``up`` prints the broker address on stdout (and nothing else there), so ``BS=$(floe kafka up)`` works.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from eventbus.admin import wait_for_broker
from eventbus.broker import BrokerError
from floe.home import broker_for, kafka_settings, state_home

__all__ = ["add_parser", "kafka_up"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("kafka", help="run the local Kafka broker (single node, KRaft, loopback)")
    ksub = p.add_subparsers(dest="kafka_cmd", required=True, metavar="{up,down,status,logs}")
    up = ksub.add_parser("up", help="start the broker (no-op if running); prints its address")
    up.add_argument("--port", type=int, default=None, help="client port (default 9092; 0 = any free port)")
    up.add_argument("--controller-port", type=int, default=None, help="controller port (default 9093)")
    up.add_argument("--timeout", type=float, default=90.0, help="readiness deadline in seconds")
    ksub.add_parser("down", help="stop the broker (SIGTERM, then SIGKILL after 30 s); no-op if stopped")
    ksub.add_parser("status", help="running (exit 0) or stopped (exit 3)")
    logs = ksub.add_parser("logs", help="print the broker log")
    logs.add_argument("-f", "--follow", action="store_true")
    logs.add_argument("-n", "--lines", type=int, default=200)
    p.set_defaults(func=run)


def kafka_up(home: Path, port: int | None = None, controller_port: int | None = None, timeout: float = 90.0) -> str:
    """Start (or find) the broker of ``home``; return its address once it answers metadata requests."""
    broker = broker_for(home)
    address = broker.start(port, controller_port, ready_timeout_s=timeout)
    wait_for_broker(kafka_settings(address, home), timeout_s=timeout)
    return address


def run(args: argparse.Namespace) -> int:
    home = state_home(args.state_dir)
    broker = broker_for(home)
    cmd = args.kafka_cmd
    if cmd == "up":
        started = time.monotonic()
        was = broker.status()
        try:
            address = kafka_up(home, args.port, args.controller_port, args.timeout)
        except BrokerError as exc:
            print(f"floe kafka up: {exc}\nbroker log: {broker.log_path}", file=sys.stderr)
            return 1
        verb = "already running" if was else f"started in {time.monotonic() - started:.1f}s"
        print(f"kafka {verb} at {address} (state {broker.state_dir})", file=sys.stderr)
        print(address)
        return 0
    if cmd == "down":
        pid = broker.pid()
        broker.stop()
        print("kafka stopped" if pid else "kafka was not running", file=sys.stderr)
        return 0
    if cmd == "status":
        status = broker.status()
        print(status if status else f"stopped state={broker.state_dir}")
        return 0 if status else 3
    if cmd == "logs":
        if not broker.log_path.is_file():
            print(f"floe kafka logs: no broker log at {broker.log_path}", file=sys.stderr)
            return 1
        if args.follow:
            os.execvp("tail", ["tail", "-n", str(args.lines), "-f", str(broker.log_path)])
        lines = broker.log_path.read_text(errors="replace").splitlines()[-args.lines :]
        print("\n".join(lines))
        return 0
    raise AssertionError(cmd)
