"""``floe audit``: count over the topics and check the exactly-once promises of the main job.

Reads every relevant topic from its beginning to its current end with a group-less ``read_committed`` replay (no
consumer group, no commit: production offsets are untouched) and checks, per session, group, batch and version:

- **sessions**: requested / with a terminal ``SessionFinished`` / rewarded. A ``SessionFinished`` published twice
  is *tolerated* (the gateway documents it; the scorer and rollout keep the first), so it is reported, not a
  violation. A second ``RewardPublished`` for a session is a violation (the scorer promises exactly one).
- **trajectories**: the session ids of every ``TrajectoryBatch`` (inline Arrow or claim check). A session in two
  batches, or a batch id published twice, is a *duplicated trajectory*; a session of a batched group (requested,
  finished or rewarded with that group id) without rows in that group's batch is a *lost trajectory* (the rollout
  keeps failed/cancelled sessions as masked rows, it never drops them).
- **weights**: versions consecutive; a version published again with the same ``batch_id`` is a re-announcement (the
  learner does it on restart) and is fine, a version with two different batches is not; no ``batch_id`` trained
  twice; every trained batch exists on the batches topic.
- **stranded groups** (only with ``stranded_after_s``): a group requested more than that many seconds before the
  newest batch was created, and not batched, is a violation (a stuck group, e.g. sessions of a dead gateway node
  that nothing ever ended).

Safe on a live run: topics are read effects-first (weights, batches, rewards, finished, requests), so an event
published while the audit reads is never mistaken for a dangling reference.

Limits: the weights topic is compacted, so on a long-lived broker older versions may be gone (versions are then
checked from the oldest one retained); topics are read as retained (a retention cut looks like missing data).
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from contracts import (
    REWARDS,
    SESSIONS_CANCEL,
    SESSIONS_FINISHED,
    SESSIONS_REQUESTED,
    TRAJECTORY_BATCHES,
    WEIGHTS,
    Event,
    SessionFinished,
    SessionRequested,
    Topic,
    TrajectoryBatch,
    read_ipc,
)
from eventbus import EventBusError, KafkaSettings
from eventbus.replay import replay
from floe.home import kafka_settings, state_home

__all__ = ["AuditReport", "add_parser", "audit", "run"]


@dataclass
class AuditReport:
    counts: dict[str, int] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # distinct weight versions, ascending
    version_batches: dict[int, str | None] = field(default_factory=dict)
    batch_sessions: dict[str, list[str]] = field(default_factory=dict)  # batch id -> session ids (sorted)
    unbatched_groups: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def table(self) -> str:
        width = max((len(k) for k in self.counts), default=10)
        lines = ["floe audit", "-" * (width + 12)]
        lines += [f"{k:<{width}}  {v:>8}" for k, v in self.counts.items()]
        lines.append("-" * (width + 12))
        for note in self.notes:
            lines.append(f"note: {note}")
        if self.violations:
            lines.append(f"VIOLATIONS ({len(self.violations)}):")
            lines += [f"  - {v}" for v in self.violations[:50]]
            if len(self.violations) > 50:
                lines.append(f"  … and {len(self.violations) - 50} more")
        else:
            lines.append("OK: no trajectory lost or duplicated, no duplicate reward, no batch trained twice")
        return "\n".join(lines)


E = TypeVar("E", bound=Event)


def _events(settings: KafkaSettings, topic: Topic[E], report: AuditReport, idle_timeout_s: float) -> list[E]:
    out: list[E] = []
    for record in replay(settings, topic, idle_timeout_s=idle_timeout_s):
        if not isinstance(record.event, topic.model):
            report.violations.append(f"{topic.name}[{record.partition}]@{record.offset} undecodable: {record.error}")
            continue
        out.append(record.event)
    return out


def _batch_rows(batch: TrajectoryBatch) -> list[tuple[str, str]]:
    """(session_id, group_id) per row of a batch, inline or from its claim-check file."""
    if batch.arrow_ipc is not None:
        table = read_ipc(batch.arrow_ipc)
    else:
        assert batch.uri is not None
        import hashlib

        uri = batch.uri
        if "://" in uri and not uri.startswith("file://"):
            import fsspec  # remote claim checks (s3://, gs://…): the rollout writes them through fsspec

            with fsspec.open(uri, "rb") as fh:
                data = fh.read()
        else:
            data = Path(uri.removeprefix("file://")).read_bytes()
        if hashlib.sha256(data).hexdigest() != batch.sha256:
            raise ValueError(f"claim-check file {uri} does not match its sha256")
        table = read_ipc(data)
    cols = table.select(["session_id", "group_id"])
    return list(zip(cols.column("session_id").to_pylist(), cols.column("group_id").to_pylist(), strict=True))


def audit(settings: KafkaSettings, *, stranded_after_s: float | None = None, idle_timeout: float = 10.0) -> AuditReport:
    report = AuditReport()
    v = report.violations

    # Downstream topics first. On a live run every event is published only after the events it refers to are
    # committed (a reward after its SessionFinished, a batch after its rewards, a version after its batch), so reading
    # effects before causes never shows a reference to an event that was published after its topic was read.
    weights = _events(settings, WEIGHTS, report, idle_timeout)
    batches = _events(settings, TRAJECTORY_BATCHES, report, idle_timeout)
    cancels = _events(settings, SESSIONS_CANCEL, report, idle_timeout)
    rewards = _events(settings, REWARDS, report, idle_timeout)
    finished = _events(settings, SESSIONS_FINISHED, report, idle_timeout)
    requested = _events(settings, SESSIONS_REQUESTED, report, idle_timeout)

    # ---- sessions
    req_by_sid: dict[str, SessionRequested] = {}
    req_count: Counter[str] = Counter()
    group_members: dict[str, set[str]] = defaultdict(set)
    group_requested_at: dict[str, int] = {}
    group_size: dict[str, int] = {}  # as the scheduler stamped it on the requests (absent for requests of others)
    for r in requested:
        if (stamped := r.metadata.get("group_size", "")).isdigit():
            group_size[r.group_id] = int(stamped)
        req_count[r.session_id] += 1
        req_by_sid.setdefault(r.session_id, r)
        group_members[r.group_id].add(r.session_id)
        group_requested_at[r.group_id] = min(group_requested_at.get(r.group_id, r.requested_at), r.requested_at)
    fin_count: Counter[str] = Counter(f.session_id for f in finished)
    first_fin: dict[str, SessionFinished] = {}
    for f in finished:
        first_fin.setdefault(f.session_id, f)
        group_members[f.group_id].add(f.session_id)
    rew_count: Counter[str] = Counter(r.session_id for r in rewards)
    rew_values: dict[str, set[tuple[float, str]]] = defaultdict(set)
    for rw in rewards:
        rew_values[rw.session_id].add((rw.reward, rw.outcome.value))
        group_members[rw.group_id].add(rw.session_id)
        if rw.session_id not in fin_count:
            v.append(f"reward for session {rw.session_id} that has no SessionFinished")
    for sid, n in sorted(rew_count.items()):
        if n > 1:
            conflict = " (conflicting values)" if len(rew_values[sid]) > 1 else ""
            v.append(f"session {sid}: {n} RewardPublished{conflict}")
    for sid, f in sorted(first_fin.items()):
        if sid in req_by_sid and req_by_sid[sid].group_id != f.group_id:
            v.append(f"session {sid}: finished in group {f.group_id}, requested in {req_by_sid[sid].group_id}")

    statuses = Counter(f.status.value for f in first_fin.values())
    report.counts.update(
        {
            "sessions requested": len(req_count),
            "  requests re-published (same id)": sum(n - 1 for n in req_count.values()),
            "sessions finished (terminal)": len(fin_count),
            **{f"  {k}": n for k, n in sorted(statuses.items())},
            "  SessionFinished duplicates (tolerated)": sum(n - 1 for n in fin_count.values()),
            "sessions rewarded": len(rew_count),
            "  RewardPublished duplicates": sum(n - 1 for n in rew_count.values()),
            "cancel requests": len(cancels),
        }
    )

    # ---- batches and trajectories
    batch_ids: Counter[str] = Counter(b.batch_id for b in batches)
    for bid, n in sorted(batch_ids.items()):
        if n > 1:
            v.append(f"batch {bid} published {n} times (duplicated trajectories)")
    session_batches: dict[str, list[str]] = defaultdict(list)
    group_batches: dict[str, set[str]] = defaultdict(set)
    group_rows: dict[str, set[str]] = defaultdict(set)
    rows_total = 0
    seen_batch: set[str] = set()
    for b in batches:
        if b.batch_id in seen_batch:
            continue
        seen_batch.add(b.batch_id)
        try:
            rows = _batch_rows(b)
        except (OSError, ValueError) as exc:
            v.append(f"batch {b.batch_id} unreadable: {exc}")
            continue
        rows_total += len(rows)
        sids = sorted({sid for sid, _ in rows})
        report.batch_sessions[b.batch_id] = sids
        for sid in sids:
            session_batches[sid].append(b.batch_id)
        for sid, gid in rows:
            group_batches[gid].add(b.batch_id)
            group_rows[gid].add(sid)
            if sid in req_by_sid and req_by_sid[sid].group_id != gid:
                v.append(f"batch {b.batch_id}: session {sid} in group {gid}, requested in {req_by_sid[sid].group_id}")
        if len(sids) != b.num_sessions:
            v.append(f"batch {b.batch_id}: header says {b.num_sessions} sessions, rows hold {len(sids)}")
    for sid, in_batches in sorted(session_batches.items()):
        if len(in_batches) > 1:
            v.append(f"session {sid} in {len(in_batches)} batches {in_batches} (duplicated trajectory)")
    for gid, gbatches in sorted(group_batches.items()):
        if len(gbatches) > 1:
            v.append(f"group {gid} split over batches {sorted(gbatches)}")
        lost = sorted(group_members.get(gid, set()) - group_rows[gid])
        if lost:
            v.append(f"group {gid}: session(s) {lost} missing from its batch (lost trajectory)")
    batched_sessions = set(session_batches)
    rewarded_unbatched = sorted(sid for sid in rew_count if sid not in batched_sessions)
    unbatched = sorted(g for g in group_members if g not in group_batches)
    report.unbatched_groups = unbatched
    report.counts.update(
        {
            "trajectory batches": len(batch_ids),
            "  rows": rows_total,
            "  sessions in batches": len(batched_sessions),
            "  groups in batches": len(group_batches),
            "groups not batched (yet)": len(unbatched),
            "  rewarded sessions not batched": len(rewarded_unbatched),
        }
    )
    if stranded_after_s is not None and batches:
        newest = max(b.created_at for b in batches)
        for gid in unbatched:
            at = group_requested_at.get(gid)
            if at is not None and newest - at > stranded_after_s * 1000:
                done = sum(1 for sid in group_members[gid] if sid in fin_count)
                size = group_size.get(gid, len(group_members[gid]))
                short = (
                    f"; only {len(group_members[gid])} of its {size} sessions requested"
                    if size > len(group_members[gid])
                    else ""
                )
                v.append(
                    f"group {gid} stranded: requested {(newest - at) / 1000:.0f}s before the newest batch, "
                    f"never batched ({done}/{len(group_members[gid])} sessions finished{short})"
                )

    # ---- weights
    by_version: dict[int, set[str | None]] = defaultdict(set)
    announcements: Counter[int] = Counter()
    order: list[int] = []
    for w in weights:
        by_version[w.version].add(w.batch_id)
        announcements[w.version] += 1
        order.append(w.version)
    for version, vbatches in sorted(by_version.items()):
        if len(vbatches) > 1:
            v.append(f"version {version} published for different batches {sorted(map(str, vbatches))}")
    for prev, nxt in itertools.pairwise(order):
        if nxt < prev:
            v.append(f"weights went backwards: version {nxt} published after {prev}")
    versions = sorted(by_version)
    report.versions = versions
    report.version_batches = {ver: next(iter(vb)) for ver, vb in by_version.items()}
    if versions:
        gaps = sorted(set(range(versions[0], versions[-1] + 1)) - set(versions))
        if gaps:
            v.append(f"weight versions not consecutive: missing {gaps}")
        if versions[0] != 1:
            report.notes.append(f"oldest weight version retained is {versions[0]} (compacted topic?)")
    trained: dict[str, list[int]] = defaultdict(list)
    for ver, vbatches in by_version.items():
        for maybe in vbatches:
            if maybe is not None:
                trained[maybe].append(ver)
    for tbid, vers in sorted(trained.items()):
        if len(vers) > 1:
            v.append(f"batch {tbid} trained twice: versions {sorted(vers)}")
        if tbid not in batch_ids:
            v.append(f"version(s) {vers} trained on batch {tbid}, which is not on {TRAJECTORY_BATCHES.name}")
    report.counts.update(
        {
            "weight versions": len(versions),
            "  newest version": versions[-1] if versions else 0,
            "  re-announcements (same version+batch)": sum(n - 1 for n in announcements.values()),
            "batches trained": len(trained),
            "  batches not (yet) trained": len(set(batch_ids) - set(trained)),
        }
    )
    return report


# --------------------------------------------------------------------------------------------------- CLI


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("audit", help="count over the topics: lost/duplicated trajectories, batches trained twice")
    p.add_argument("--bootstrap", help="Kafka bootstrap servers")
    p.add_argument(
        "--stranded-after",
        type=float,
        default=None,
        metavar="SECONDS",
        help="flag groups requested this long before the newest batch and never batched (default: off)",
    )
    p.add_argument("--idle-timeout", type=float, default=10.0, help="stop reading a topic after this long idle")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = kafka_settings(args.bootstrap, state_home(args.state_dir))
    try:
        report = audit(settings, stranded_after_s=args.stranded_after, idle_timeout=args.idle_timeout)
    except EventBusError as exc:
        print(f"floe audit: {exc} (bootstrap {settings.bootstrap_servers})", file=sys.stderr)
        return 2
    print(report.table())
    return 0 if report.ok else 1
