"""The Arrow schema of trajectory batches, its typed row, and rows <-> table: defined once, here.

One row is one training sequence (a *trace*): ``tokens`` is prompt + response, and the per-token columns have the
same length as ``tokens``. Prompt positions are never trainable. For every trainable position the token is a
sampled token and ``logprobs`` is its sampling logprob under ``weight_versions``' weights; masked positions carry
logprob 0 and weight version -1.

Rows of one session share ``session_id`` and the session's ``advantage``; rows of one GRPO group share
``group_id``. ``session_weight`` is 1 / (traces in the session), so a loss that averages per session does not give
sessions with more traces more weight.

Every producer of batches (the rollout, tests, benchmarks) builds ``TrajectoryRow`` values and turns them into a
table with ``trajectory_table`` (or straight into IPC bytes with ``to_ipc``); ``trajectory_rows`` reads them back.
A row checks its shape when built (per-token columns aligned with ``tokens``, ``prompt_len`` and ``trace_index`` in
range); the trainability invariants above are the producer's to keep and the learner's to enforce, because the
learner's tests feed it rows that break them on purpose.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from dataclasses import dataclass

import pyarrow as pa

from contracts.errors import DecodeError, SchemaVersionError

__all__ = [
    "TRAJECTORY_SCHEMA",
    "TRAJECTORY_SCHEMA_VERSION",
    "TrajectoryRow",
    "read_ipc",
    "to_ipc",
    "trajectory_rows",
    "trajectory_table",
    "validate_table",
]

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
_PER_TOKEN_AND_TOKENS = ("tokens", *_PER_TOKEN)


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


@dataclass(frozen=True, slots=True, kw_only=True)
class TrajectoryRow:
    """One row of ``TRAJECTORY_SCHEMA``, field for field; ``trajectory_id`` is derived (``session_id/trace_index``).

    Raises ``ValueError`` when built with per-token columns of another length than ``tokens``, or ``prompt_len`` /
    ``trace_index`` out of range.
    """

    session_id: str
    group_id: str
    task_id: str
    harness: str
    builder: str
    trace_index: int
    num_traces: int
    prompt_len: int
    tokens: tuple[int, ...]
    loss_mask: tuple[int, ...]
    logprobs: tuple[float, ...]
    weight_versions: tuple[int, ...]
    reward: float
    advantage: float
    session_weight: float
    status: str  # DONE / TIMEOUT / FAILED / CANCELLED
    masked_reason: str | None = None

    def __post_init__(self) -> None:
        n = len(self.tokens)
        for name in _PER_TOKEN:
            if len(getattr(self, name)) != n:
                raise ValueError(
                    f"trajectory row {self.trajectory_id}: {name} has {len(getattr(self, name))} values, tokens has {n}"
                )
        if not 0 <= self.prompt_len <= n:
            raise ValueError(f"trajectory row {self.trajectory_id}: prompt_len {self.prompt_len} not in [0, {n}]")
        if not 0 <= self.trace_index < self.num_traces:
            raise ValueError(
                f"trajectory row {self.trajectory_id}: trace_index {self.trace_index} not in [0, {self.num_traces})"
            )

    @property
    def trajectory_id(self) -> str:
        return f"{self.session_id}/{self.trace_index}"


def trajectory_table(rows: Iterable[TrajectoryRow]) -> pa.Table:
    """The rows as one ``TRAJECTORY_SCHEMA`` table (one chunk per column), in order."""
    rows = list(rows)
    # Column by column: one Python list per column converts faster than one dict per row, to the same table.
    columns = {name: [getattr(row, name) for row in rows] for name in TRAJECTORY_SCHEMA.names}
    return pa.Table.from_pydict(columns, schema=TRAJECTORY_SCHEMA)


def trajectory_rows(table: pa.Table) -> list[TrajectoryRow]:
    """The rows of a ``TRAJECTORY_SCHEMA`` table; raise ``DecodeError`` if it is not one, or a row is malformed."""
    validate_table(table)
    out = []
    for raw in table.to_pylist():
        trajectory_id = raw.pop("trajectory_id")
        for name in _PER_TOKEN_AND_TOKENS:
            raw[name] = tuple(raw[name])
        try:
            row = TrajectoryRow(**raw)
        except ValueError as exc:
            raise DecodeError(str(exc)) from exc
        if row.trajectory_id != trajectory_id:
            raise DecodeError(f"trajectory_id {trajectory_id!r} is not session_id/trace_index ({row.trajectory_id!r})")
        out.append(row)
    return out


def to_ipc(rows: Iterable[TrajectoryRow] | pa.Table, compression: str | None = "zstd") -> bytes:
    """Encode rows or a ``TRAJECTORY_SCHEMA`` table as one Arrow IPC stream."""
    table = rows if isinstance(rows, pa.Table) else trajectory_table(rows)
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
