"""``floe replay``: print a topic's events as JSON lines, or re-publish them into another topic.

Group-less (assigned partitions, no commits), so it never moves a service's offsets. ``--from``/``--to`` take an
offset or an ISO-8601 time; the range is ``[from, to)`` and defaults to the whole topic as it is when the replay
starts. Undecodable messages are printed with an ``error`` field and their raw bytes (base64), never dropped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Iterator
from typing import IO, Any

from contracts import Topic
from eventbus import EventBusError, KafkaSettings, Producer, ensure_topics
from eventbus.replay import Position, ReplayRecord, parse_position, replay
from floe.home import kafka_settings, state_home
from floe.topics_cmd import resolve_topic

__all__ = ["add_parser"]


def _position(text: str) -> Position:
    try:
        return parse_position(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("replay", help="print (or re-publish) a topic's events, decoded with the contracts")
    p.add_argument("--topic", required=True, help="topic name (a registry topic or a '<registry name>.<suffix>' copy)")
    p.add_argument("--from", dest="start", type=_position, help="offset or ISO time to start at (default: beginning)")
    p.add_argument("--to", dest="end", type=_position, help="offset or ISO time to stop before (default: current end)")
    p.add_argument("--partition", type=int, action="append", help="only this partition (repeatable)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--into", help="re-publish the decoded events into this topic (created if missing)")
    out.add_argument("--jsonl", help="write JSON lines to this file instead of stdout")
    p.add_argument("--bootstrap", help="Kafka bootstrap servers")
    p.add_argument("--idle-timeout", type=float, default=5.0, help="stop after this many seconds without data")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = kafka_settings(args.bootstrap, state_home(args.state_dir))
    try:
        topic = resolve_topic(args.topic)
    except KeyError as exc:
        print(f"floe replay: {exc.args[0]}", file=sys.stderr)
        return 2
    records = replay(
        settings, topic, start=args.start, end=args.end, partitions=args.partition, idle_timeout_s=args.idle_timeout
    )
    try:
        if args.into:
            count, bad = asyncio.run(_republish(settings, topic.with_name(args.into), records))
            print(f"replayed {count} event(s) into {args.into}; {bad} undecodable skipped", file=sys.stderr)
        elif args.jsonl:
            with open(args.jsonl, "w", encoding="utf-8") as fh:
                count, bad = _write(records, fh)
            print(f"wrote {count} record(s) to {args.jsonl} ({bad} undecodable)", file=sys.stderr)
        else:
            count, bad = _write(records, sys.stdout)
    except EventBusError as exc:
        print(f"floe replay: {exc} (bootstrap {settings.bootstrap_servers})", file=sys.stderr)
        return 1
    return 0


def _write(records: Iterator[ReplayRecord], fh: IO[str]) -> tuple[int, int]:
    count = bad = 0
    for record in records:
        fh.write(json.dumps(record.as_json(), sort_keys=True) + "\n")
        count += 1
        bad += record.event is None
    fh.flush()
    return count, bad


async def _republish(settings: KafkaSettings, into: Topic[Any], records: Iterator[ReplayRecord]) -> tuple[int, int]:
    await ensure_topics(settings, [into])
    count = bad = 0
    async with Producer(settings) as producer:
        pending: list[Any] = []
        for record in records:
            if record.event is None:
                bad += 1
                print(f"skipping {record.topic}[{record.partition}]@{record.offset}: {record.error}", file=sys.stderr)
                continue
            pending.append(producer.send(into, record.event))
            if len(pending) >= 500:
                await asyncio.gather(*pending)
                count += len(pending)
                pending = []
        await asyncio.gather(*pending)
        count += len(pending)
    return count, bad
