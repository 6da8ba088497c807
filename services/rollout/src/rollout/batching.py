"""Turn finished groups into ``TrajectoryBatch`` events: Arrow IPC inline, or a claim check above a size limit.

- The rows are ``contracts.TrajectoryRow`` values and the table is ``contracts.trajectory_table`` (schema
  ``TRAJECTORY_SCHEMA`` as is); the Arrow stream uses IPC buffer compression (zstd by default; on top of it the
  producer adds only its cheap lz4 batch compression; docs/kafka.md, "Compression").
- A stream larger than ``inline_max_bytes`` is written to ``claim_url`` (a directory, or any fsspec URL) under a
  content-addressed name ``<batch_id>-<sha256[:16]>.arrow``: the file is written completely (temporary name, then
  rename) *before* the event that names it is produced, so an aborted transaction leaves at most an orphan file,
  never a dangling reference (docs/kafka.md, "Claim-check batches"). The event carries ``uri`` and the full ``sha256``.
- ``batch_id`` is derived from the builder and the batch's group ids, so rebuilding the same groups after a crash
  yields the same id, and the same bytes (``created_at`` is the latest ``finished_at`` of the batch's sessions, not
  the wall clock).

Limits: a claim-check file is never deleted here (retention is the storage's job); remote fsspec backends need their
own package installed (``s3fs``, ``gcsfs``...).
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import fsspec
import pyarrow as pa

from contracts import TrajectoryBatch, read_ipc, to_ipc, trajectory_table
from rollout.groups import GroupResult
from rollout.trace import ReconstructionStats

__all__ = ["BatchEncoder", "batch_id_for", "fetch_claim", "load_batch_table", "store_claim"]


def batch_id_for(builder: str, group_ids: Sequence[str]) -> str:
    digest = hashlib.sha256("\n".join([builder, *sorted(group_ids)]).encode()).hexdigest()
    return f"b-{digest[:16]}"


@dataclass(frozen=True)
class BatchEncoder:
    builder: str
    inline_max_bytes: int = 900 * 1024
    claim_url: str = ".floe/batches"
    compression: str | None = "zstd"

    def encode(
        self, groups: Sequence[GroupResult], step: int, extra_metrics: dict[str, float] | None = None
    ) -> TrajectoryBatch:
        if not groups:
            raise ValueError("a batch needs at least one group")
        table = trajectory_table(row for g in groups for row in g.rows)
        data = to_ipc(table, compression=self.compression)
        versions = [g.weight_versions() for g in groups]
        batch_id = batch_id_for(self.builder, [g.group_id for g in groups])
        common: dict[str, Any] = {
            "batch_id": batch_id,
            "step": step,
            "num_rows": table.num_rows,
            "num_groups": len(groups),
            "num_sessions": sum(len(g.sessions) for g in groups),
            "builder": self.builder,
            "min_weight_version": min(v[0] for v in versions),
            "max_weight_version": max(v[1] for v in versions),
            "size_bytes": len(data),
            "metrics": {**batch_metrics(groups), **(extra_metrics or {})},
            "created_at": max(g.finished_at for g in groups),
        }
        if len(data) <= self.inline_max_bytes:
            return TrajectoryBatch(arrow_ipc=data, **common)
        sha = hashlib.sha256(data).hexdigest()
        uri = self._store(f"{batch_id}-{sha[:16]}.arrow", data)
        return TrajectoryBatch(uri=uri, sha256=sha, **common)

    def _store(self, name: str, data: bytes) -> str:
        return store_claim(self.claim_url, name, data)


def store_claim(claim_url: str, name: str, data: bytes) -> str:
    """Write ``data`` under ``claim_url`` as ``name`` (whole, then renamed) unless it is there already; its URI."""
    fs, root = fsspec.core.url_to_fs(claim_url)
    fs.makedirs(root, exist_ok=True)
    path = f"{root.rstrip('/')}/{name}"
    if not (fs.exists(path) and fs.size(path) == len(data)):
        tmp = f"{path}.tmp-{uuid.uuid4().hex}"
        with fs.open(tmp, "wb") as fh:
            fh.write(data)
        fs.mv(tmp, path)
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return path if protocol in ("file", "local") else f"{protocol}://{path}"


def fetch_claim(uri: str, sha256: str) -> bytes:
    """A claim-check file's bytes, checksum verified."""
    with fsspec.open(uri, "rb") as fh:
        data: bytes = fh.read()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise ValueError(f"claim-check file {uri} does not match its sha256")
    return data


def batch_metrics(groups: Sequence[GroupResult]) -> dict[str, float]:
    stats = ReconstructionStats()
    masked = trainable = 0
    for g in groups:
        stats.add(g.stats)
        for s in g.sessions:
            trainable += s.trainable
            masked += not s.trainable
    out = {f"reconstruction.{k}": float(v) for k, v in stats.as_dict().items()}
    out["sessions.trainable"] = float(trainable)
    out["sessions.masked"] = float(masked)
    out["groups.zero_signal"] = float(sum(g.zero_signal for g in groups))
    return out


def load_batch_table(batch: TrajectoryBatch) -> pa.Table:
    """The batch's Arrow table, inline or fetched from its claim check (checksum verified)."""
    if batch.arrow_ipc is not None:
        return read_ipc(batch.arrow_ipc)
    assert batch.uri is not None and batch.sha256 is not None
    return read_ipc(fetch_claim(batch.uri, batch.sha256))
