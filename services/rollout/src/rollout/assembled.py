"""A group between the rollout's two stages: ``GroupResult`` (in memory) <-> ``GroupAssembled`` (on the wire).

The shard that owns a group builds its rows and publishes them once; the leader turns the event back into the same
``GroupResult`` (rows, per-session stats and verdicts, the scheduler's metadata) for selection, batching and metrics.
Rows travel as Arrow IPC (``contracts.arrow``), inline up to ``inline_max_bytes`` and as a content-addressed
claim-check file above it (written before the event that names it, as for batches: ``rollout.batching``). The
per-row extras of the Parquet dataset stay with the shard, which writes the dataset.
"""

from __future__ import annotations

import hashlib
from typing import Any

from contracts import AssembledSession, GroupAssembled, SessionKind, read_ipc, to_ipc, trajectory_rows
from rollout.batching import fetch_claim, store_claim
from rollout.groups import GroupResult, SessionRows
from rollout.trace import COUNTS, ReconstructionStats

__all__ = ["from_event", "to_event"]


def _stats_dict(stats: ReconstructionStats) -> dict[str, int]:
    out = {name: int(getattr(stats, name)) for name in COUNTS}
    out.update({f"break.{reason}": count for reason, count in sorted(stats.break_reasons.items())})
    return out


def _stats_of(raw: dict[str, int]) -> ReconstructionStats:
    stats = ReconstructionStats()
    for name in COUNTS:
        setattr(stats, name, int(raw.get(name, 0)))
    stats.break_reasons = {k.removeprefix("break."): v for k, v in raw.items() if k.startswith("break.")}
    return stats


def to_event(
    group: GroupResult,
    builder: str,
    *,
    inline_max_bytes: int,
    claim_url: str,
    compression: str | None = "zstd",
) -> GroupAssembled:
    data = to_ipc(group.rows, compression=compression)
    common: dict[str, Any] = {
        "group_id": group.group_id,
        "kind": SessionKind(group.kind),
        "builder": builder,
        "rollout_step": group.rollout_step,
        "metadata": dict(group.metadata),
        "zero_signal": group.zero_signal,
        "trainable_sessions": group.trainable_sessions,
        "finished_at": group.finished_at,
        "sessions": [
            AssembledSession(
                session_id=s.session_id,
                harness=s.harness,
                rows=len(s.rows),
                trainable=s.trainable,
                resolved=s.resolved,
                stats=_stats_dict(s.stats),
            )
            for s in group.sessions
        ],
        "size_bytes": len(data),
    }
    if len(data) <= inline_max_bytes:
        return GroupAssembled(arrow_ipc=data, **common)
    sha = hashlib.sha256(data).hexdigest()
    uri = store_claim(claim_url, f"group-{group.group_id}-{sha[:16]}.arrow", data)
    return GroupAssembled(uri=uri, sha256=sha, **common)


def from_event(event: GroupAssembled) -> GroupResult:
    if event.arrow_ipc is not None:
        table = read_ipc(event.arrow_ipc)
    else:
        assert event.uri is not None and event.sha256 is not None
        table = read_ipc(fetch_claim(event.uri, event.sha256))
    rows = trajectory_rows(table)
    if len(rows) != sum(s.rows for s in event.sessions):
        raise ValueError(
            f"group {event.group_id}: {len(rows)} rows, its sessions name {sum(s.rows for s in event.sessions)}"
        )
    sessions: list[SessionRows] = []
    at = 0
    for s in event.sessions:
        own = rows[at : at + s.rows]
        at += s.rows
        sessions.append(
            SessionRows(
                session_id=s.session_id,
                harness=s.harness,
                rows=own,
                extras=[],
                stats=_stats_of(s.stats),
                trainable=s.trainable,
                resolved=s.resolved,
            )
        )
    return GroupResult(
        group_id=event.group_id,
        sessions=sessions,
        zero_signal=event.zero_signal,
        trainable_sessions=event.trainable_sessions,
        finished_at=event.finished_at,
        kind=event.kind.value,
        metadata=dict(event.metadata),
        rollout_step=event.rollout_step,
    )
