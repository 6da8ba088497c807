"""``floe topics create|list|describe``: topics from the contracts registry (``contracts.TOPICS``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from contracts import TOPICS, Topic, topic_by_name
from eventbus import EventBusError, describe_topics, ensure_topics_sync, list_topics
from floe.home import kafka_settings, state_home

__all__ = ["add_parser", "resolve_topic", "topics_table"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("topics", help="create, list or describe topics")
    p.add_argument("--bootstrap", help="Kafka bootstrap servers (default: see `floe --help`)")
    tsub = p.add_subparsers(dest="topics_cmd", required=True, metavar="{create,list,describe}")
    create = tsub.add_parser("create", help="create registry topics that are missing (all by default)")
    create.add_argument("names", nargs="*", help="registry topic names (default: every topic)")
    lst = tsub.add_parser("list", help="topic names on the broker")
    lst.add_argument("--all", action="store_true", help="include internal topics (__consumer_offsets...)")
    describe = tsub.add_parser("describe", help="partitions, message counts and config")
    describe.add_argument("names", nargs="*", help="topic names (default: the registry topics on the broker)")
    describe.add_argument("--json", action="store_true", help="one JSON object per topic")
    p.set_defaults(func=run)


def resolve_topic(name: str) -> Topic[Any]:
    """A registry topic by exact name, or a copy of one for names like ``floe.model-calls.replay``."""
    try:
        return topic_by_name(name)
    except KeyError:
        pass
    for topic in sorted(TOPICS, key=lambda t: -len(t.name)):
        if name.startswith(topic.name + "."):
            return topic.with_name(name)
    raise KeyError(f"{name!r} is not a registry topic (or a '<registry name>.<suffix>' copy of one)")


def topics_table(settings: Any, names: list[str]) -> list[dict[str, Any]]:
    rows = []
    for info in describe_topics(settings, names):
        rows.append(
            {
                "topic": info.name,
                "partitions": info.partitions,
                "messages": info.messages,
                "end_offsets": [info.watermarks[p][1] for p in sorted(info.watermarks)],
                "config": info.config,
            }
        )
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    if not rows:
        print("(no topics)")
        return
    width = max(len(r["topic"]) for r in rows)
    print(f"{'TOPIC':<{width}}  PARTITIONS  MESSAGES  MAX.MESSAGE.BYTES  CLEANUP")
    for r in rows:
        cfg = r["config"]
        print(
            f"{r['topic']:<{width}}  {r['partitions']:>10}  {r['messages']:>8}  "
            f"{cfg.get('max.message.bytes', '-'):>17}  {cfg.get('cleanup.policy', 'delete')}"
        )


def run(args: argparse.Namespace) -> int:
    settings = kafka_settings(args.bootstrap, state_home(args.state_dir))
    try:
        if args.topics_cmd == "create":
            try:
                chosen = [topic_by_name(n) for n in args.names] if args.names else list(TOPICS)
            except KeyError as exc:
                print(f"floe topics create: {exc.args[0]}", file=sys.stderr)
                return 2
            created = ensure_topics_sync(settings, chosen)
            for topic in chosen:
                print(f"{topic.name}\t{'created' if topic.name in created else 'exists'}")
            return 0
        if args.topics_cmd == "list":
            for name in list_topics(settings, include_internal=args.all):
                print(name)
            return 0
        if args.topics_cmd == "describe":
            names = args.names or [t.name for t in TOPICS if t.name in set(list_topics(settings))]
            rows = topics_table(settings, names)
            if args.json:
                for row in rows:
                    print(json.dumps(row, sort_keys=True))
            else:
                print_table(rows)
            return 0
    except EventBusError as exc:
        print(f"floe topics {args.topics_cmd}: {exc} (bootstrap {settings.bootstrap_servers})", file=sys.stderr)
        return 1
    raise AssertionError(args.topics_cmd)
