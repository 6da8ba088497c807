"""The Arrow schema of trajectory batches: defined once, here.

One row is one training sequence (a *trace*): ``tokens`` is prompt + response, and the per-token columns have the
same length as ``tokens``. Prompt positions are never trainable. For every trainable position the token is a
sampled token and ``logprobs`` is its sampling logprob under ``weight_versions``' weights; masked positions carry
logprob 0 and weight version -1.

Rows of one session share ``session_id`` and the session's ``advantage``; rows of one GRPO group share
``group_id``. ``session_weight`` is 1 / (traces in the session), so a loss that averages per session does not give
sessions with more traces more weight.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa

from contracts.errors import DecodeError, SchemaVersionError

__all__ = ["TRAJECTORY_SCHEMA", "TRAJECTORY_SCHEMA_VERSION", "read_ipc", "to_ipc", "validate_table"]

TRAJECTORY_SCHEMA_VERSION = 1

TRAJECTORY_SCHEMA = pa.schema(
    [
        pa.field("trajectory_id", pa.string(), nullable=False),  # f"{session_id}/{trace_index}"
        pa.field("session_id", pa.string(), nullable=False),
        pa.field("group_id", pa.string(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("harness", pa.string(), nullable=False),
        pa.field("builder", pa.string(), nullable=False),
        pa.field("trace_index", pa.int32(), nullable=False),
        pa.field("num_traces", pa.int32(), nullable=False),
        pa.field("prompt_len", pa.int32(), nullable=False),
        pa.field("tokens", pa.list_(pa.int32()), nullable=False),
        pa.field("loss_mask", pa.list_(pa.uint8()), nullable=False),
        pa.field("logprobs", pa.list_(pa.float32()), nullable=False),
        pa.field("weight_versions", pa.list_(pa.int32()), nullable=False),
        pa.field("reward", pa.float32(), nullable=False),
        pa.field("advantage", pa.float32(), nullable=False),
        pa.field("session_weight", pa.float32(), nullable=False),
        pa.field("status", pa.string(), nullable=False),  # DONE / TIMEOUT / FAILED / CANCELLED
        pa.field("masked_reason", pa.string(), nullable=True),  # why a whole row is untrainable, if it is
    ],
    metadata={b"floe.schema": b"trajectory", b"floe.schema_version": str(TRAJECTORY_SCHEMA_VERSION).encode()},
)

_PER_TOKEN = ("loss_mask", "logprobs", "weight_versions")


def validate_table(table: pa.Table) -> None:
    """Raise ``DecodeError`` unless ``table`` has our schema and per-token columns align with ``tokens``."""
    meta = table.schema.metadata or {}
    version = meta.get(b"floe.schema_version")
    if version != str(TRAJECTORY_SCHEMA_VERSION).encode():
        raise SchemaVersionError(
            "TrajectoryBatch(arrow)", version.decode() if version else None, TRAJECTORY_SCHEMA_VERSION
        )
    if not table.schema.equals(TRAJECTORY_SCHEMA, check_metadata=False):
        raise DecodeError(f"trajectory table schema mismatch:\n{table.schema}")
    import pyarrow.compute as pc

    lengths = pc.list_value_length(table.column("tokens"))
    for name in _PER_TOKEN:
        if not pc.all(pc.equal(pc.list_value_length(table.column(name)), lengths)).as_py() and table.num_rows:
            raise DecodeError(f"trajectory column {name!r} is not aligned with 'tokens'")


def to_ipc(rows: Iterable[Mapping[str, Any]] | pa.Table, compression: str | None = "zstd") -> bytes:
    """Encode rows (dicts with the schema's fields) or a table as one Arrow IPC stream."""
    table = rows if isinstance(rows, pa.Table) else pa.Table.from_pylist(list(rows), schema=TRAJECTORY_SCHEMA)
    validate_table(table)
    sink = io.BytesIO()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, TRAJECTORY_SCHEMA, options=options) as writer:
        writer.write_table(table)
    return sink.getvalue()


def read_ipc(data: bytes | memoryview) -> pa.Table:
    """Decode an Arrow IPC stream without copying the buffers (``pa.py_buffer`` wraps the bytes)."""
    try:
        table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
    except pa.ArrowInvalid as exc:
        raise DecodeError(f"not an Arrow IPC stream: {exc}") from exc
    validate_table(table)
    return table
