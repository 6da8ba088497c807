"""``floe demo``: for now, start Kafka, create every registry topic and print their state.

Later issues extend it into the whole main job (services, a training run). It is idempotent: run it twice and the
second run reuses the broker and the topics.
"""

from __future__ import annotations

import argparse
import sys
import time

from contracts import TOPICS
from eventbus import EventBusError, ensure_topics_sync
from eventbus.broker import BrokerError
from floe.home import kafka_settings, state_home
from floe.kafka_cmd import kafka_up
from floe.topics_cmd import print_table, topics_table

__all__ = ["add_parser"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("demo", help="start Kafka, create the topics and print their state")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    home = state_home(args.state_dir)
    started = time.monotonic()
    try:
        address = kafka_up(home)
    except BrokerError as exc:
        print(f"floe demo: Kafka did not start: {exc}", file=sys.stderr)
        return 1
    print(f"kafka: {address} (ready after {time.monotonic() - started:.1f}s, state {home / 'kafka'})")
    settings = kafka_settings(address, home)
    try:
        created = ensure_topics_sync(settings, TOPICS)
        print(f"topics: {len(created)} created, {len(TOPICS) - len(created)} already there")
        print_table(topics_table(settings, [t.name for t in TOPICS]))
    except EventBusError as exc:
        print(f"floe demo: {exc}", file=sys.stderr)
        return 1
    print("\nstop the broker with: floe kafka down")
    return 0
