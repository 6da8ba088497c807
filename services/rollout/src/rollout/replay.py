"""``replay-rebuild``: re-run reconstruction over recorded events, offline, into a directory.

Input is either a JSONL file of recorded events (one per line: a bare event, or ``{"type": "<EventName>", "event":
{...}}`` / ``{"topic": "<topic name>", "event": {...}}``) or the Kafka topics themselves, read with a throw-away
consumer that never commits and never writes (``eventbus.replay``): ``ModelCallRecorded`` events are filtered to
``--from``/``--to`` (an offset, or an ISO-8601 time), the sessions' requests, ends and rewards are joined from their
whole topics. Live topics and consumer groups are untouched.

Output (``--out DIR``): ``<step>-<batch_id>.arrow`` (the batch's Arrow IPC stream, exactly as it would be published),
``batches.jsonl`` (the ``TrajectoryBatch`` headers) and ``summary.json``. Groups are released in ``group_id`` order
once every event is read; sessions never finished within the input are kept as masked ``CANCELLED`` rows. The same
input therefore gives byte-identical files, whatever order the events came in.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import structlog
from pydantic import ValidationError

from contracts import (
    AdvantageMethod,
    Event,
    ModelCallRecorded,
    RewardPublished,
    SessionFinished,
    SessionRequested,
    TrajectoryBatch,
    topic_by_name,
)
from rollout.batching import BatchEncoder
from rollout.groups import GroupAssembler, GroupResult
from rollout.trace import ReconstructionStats

__all__ = ["Bound", "ReplayResult", "load_events_jsonl", "parse_bound", "rebuild", "write_result"]

log = structlog.get_logger()

_BY_NAME: dict[str, type[Event]] = {
    m.__name__: m for m in (ModelCallRecorded, SessionFinished, RewardPublished, SessionRequested)
}


@dataclass(frozen=True)
class Bound:
    offset: int | None = None
    time_ms: int | None = None

    def before(self, offset: int, time_ms: int | None) -> bool:
        """Is a message at (offset, time) before this bound?"""
        if self.offset is not None:
            return offset < self.offset
        return time_ms is not None and self.time_ms is not None and time_ms < self.time_ms


def parse_bound(text: str) -> Bound:
    """An integer is an offset; anything else must be an ISO-8601 time (UTC if no zone)."""
    if text.strip().lstrip("-").isdigit():
        return Bound(offset=int(text))
    try:
        when = datetime.fromisoformat(text)
    except ValueError as exc:
        raise ValueError(f"{text!r} is neither an offset nor an ISO-8601 time") from exc
    if when.tzinfo is None:
        from datetime import UTC

        when = when.replace(tzinfo=UTC)
    return Bound(time_ms=int(when.timestamp() * 1000))


def _detect(raw: dict[str, Any]) -> type[Event]:
    if "call_index" in raw:
        return ModelCallRecorded
    if "outcome" in raw:
        return RewardPublished
    if "node_id" in raw and "status" in raw:
        return SessionFinished
    if "harness" in raw and "group_id" in raw:
        return SessionRequested
    raise ValueError(f"cannot tell which event this is (keys: {sorted(raw)[:8]})")


def load_events_jsonl(path: str | Path) -> list[Event]:
    events: list[Event] = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
                if not isinstance(raw, dict):
                    raise ValueError("not a JSON object")
                if "event" in raw and isinstance(raw["event"], dict) and ("type" in raw or "topic" in raw):
                    model = _BY_NAME.get(raw.get("type", "")) or topic_by_name(raw["topic"]).model
                    body = raw["event"]
                else:
                    body = raw
                    model = _detect(body)
                events.append(model.model_validate(body))
            except (ValueError, KeyError, ValidationError) as exc:
                raise ValueError(f"{path}:{lineno}: {exc}") from exc
    return events


@dataclass
class ReplayResult:
    batches: list[TrajectoryBatch]
    groups: list[GroupResult]
    stats: ReconstructionStats
    closed_sessions: int
    filtered_groups: int


def rebuild(
    events: Iterable[Event],
    *,
    builder: str,
    eot_token_ids: Collection[int] | None = None,
    advantage: AdvantageMethod = "mean_std",
    groups_per_batch: int = 1,
    drop_zero_signal_groups: bool = False,
) -> ReplayResult:
    assembler = GroupAssembler(builder, advantage, eot_token_ids)
    for event in events:
        assembler.add(event)
    closed = assembler.close_open_sessions("replay: session not finished within the replayed input")
    groups = [assembler.take(g) for g in assembler.ready_groups(force=True)]
    kept = [g for g in groups if not (g.zero_signal and drop_zero_signal_groups)]
    encoder = BatchEncoder(builder=builder, inline_max_bytes=2**62)
    batches = [
        encoder.encode(kept[i : i + groups_per_batch], step=n)
        for n, i in enumerate(range(0, len(kept), groups_per_batch))
    ]
    stats = ReconstructionStats()
    for g in groups:
        stats.add(g.stats)
    return ReplayResult(batches, groups, stats, closed, len(groups) - len(kept))


def write_result(result: ReplayResult, out_dir: str | Path) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    headers: list[str] = []
    for batch in result.batches:
        assert batch.arrow_ipc is not None
        path = out / f"{batch.step:06d}-{batch.batch_id}.arrow"
        path.write_bytes(bytes(batch.arrow_ipc))
        paths.append(path)
        headers.append(batch.model_dump_json())
    (out / "batches.jsonl").write_text("".join(h + "\n" for h in headers))
    summary = {
        "batches": len(result.batches),
        "groups": len(result.groups),
        "groups_filtered_zero_signal": result.filtered_groups,
        "sessions_closed_unfinished": result.closed_sessions,
        "reconstruction": result.stats.as_dict(),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return paths


async def read_kafka(
    kafka: Any, topics: Sequence[Any], calls_topic_name: str, start: Bound | None, end: Bound | None
) -> list[Event]:
    """Events of ``topics`` read to their current end; ``ModelCallRecorded`` only within [start, end)."""
    from eventbus.replay import replay_async

    events: list[Event] = []
    skipped = 0
    async for record in replay_async(kafka, topics, idle_timeout_s=1.0):
        if record.event is None:  # the live consumers dead-lettered it; a rebuild never writes
            skipped += 1
            continue
        if record.topic == calls_topic_name:
            if start is not None and start.before(record.offset, record.timestamp_ms):
                continue
            if end is not None and not end.before(record.offset, record.timestamp_ms):
                continue
        events.append(record.event)
    if skipped:
        log.warning("undecodable messages skipped while reading", count=skipped)
    return events
