"""``floe topics create|list|describe``: topics from the contracts registry (``contracts.TOPICS``).

``create --partitions N`` sizes the session-keyed topics (those the registry gives more than one partition) for a
deployment: a consumer group has at most one member per partition, so ``floe.sessions.requested`` needs at least as
many partitions as gateway nodes (``docs/scaling.md``). Topics the registry keeps at one partition stay at one (the
learner reads trajectory batches in order; weights are compacted per policy; cancels are read by every node). An
existing topic is never changed: Kafka can only add partitions, and adding them moves session keys to other
partitions while sessions run, so a count that differs from the asked one is an error to resolve between runs.
"""

from __future__ import annotations

import argparse
import dataclasses
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
    create.add_argument(
        "names", nargs="*", help="registry topic names or '<name>.<suffix>' copies (default: every topic)"
    )
    create.add_argument(
        "--partitions",
        type=int,
        default=None,
        help="partitions of the session-keyed topics (default: the registry's; single-partition topics keep one)",
    )
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


def sized(topic: Topic[Any], partitions: int | None) -> Topic[Any]:
    """``topic`` with ``partitions`` partitions if it is a session-keyed (multi-partition) topic."""
    if partitions is None or topic.partitions == 1:
        return topic
    return dataclasses.replace(topic, partitions=partitions)


def _create(settings: Any, names: list[str], partitions: int | None) -> int:
    if partitions is not None and partitions < 1:
        print("floe topics create: --partitions must be at least 1", file=sys.stderr)
        return 2
    try:
        chosen = [sized(t, partitions) for t in ([resolve_topic(n) for n in names] if names else TOPICS)]
    except KeyError as exc:
        print(f"floe topics create: {exc.args[0]}", file=sys.stderr)
        return 2
    existing = set(list_topics(settings))
    present = {i.name: i.partitions for i in describe_topics(settings, [t.name for t in chosen if t.name in existing])}
    # Without --partitions an existing topic is fine as it is (an operator may have sized it before).
    wrong = [t for t in chosen if partitions is not None and t.name in present and present[t.name] != t.partitions]
    if wrong:
        for t in wrong:
            print(
                f"floe topics create: {t.name} exists with {present[t.name]} partitions, not {t.partitions}; floe "
                "does not repartition a topic (it moves session keys mid-run): delete and recreate it between runs",
                file=sys.stderr,
            )
        return 1
    created = ensure_topics_sync(settings, chosen)
    for topic in chosen:
        state = "created" if topic.name in created else "exists"
        print(f"{topic.name}\t{state}\t{present.get(topic.name, topic.partitions)} partitions")
    return 0


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
            return _create(settings, args.names, args.partitions)
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
