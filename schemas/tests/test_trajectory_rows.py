"""Typed trajectory rows: rows -> Arrow -> rows is the identity, the bytes are the schema's, bad rows are refused."""

from __future__ import annotations

import dataclasses
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts import (
    TRAJECTORY_SCHEMA,
    DecodeError,
    TrajectoryRow,
    read_ipc,
    to_ipc,
    trajectory_rows,
    trajectory_table,
)

# Arrow stores the float columns as float32: draw values it keeps exactly, so decoded rows compare equal.
F32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


@st.composite
def rows(draw: st.DrawFn) -> TrajectoryRow:
    n = draw(st.integers(0, 12))
    num_traces = draw(st.integers(1, 3))
    return TrajectoryRow(
        session_id=draw(st.text(min_size=1, max_size=8)),
        group_id=draw(st.text(max_size=8)),
        task_id="t",
        harness=draw(st.sampled_from(["pi", "codex"])),
        builder=draw(st.sampled_from(["per_request", "prefix_merging"])),
        trace_index=draw(st.integers(0, num_traces - 1)),
        num_traces=num_traces,
        prompt_len=draw(st.integers(0, n)),
        tokens=tuple(draw(st.lists(st.integers(0, 2**31 - 1), min_size=n, max_size=n))),
        loss_mask=tuple(draw(st.lists(st.integers(0, 1), min_size=n, max_size=n))),
        logprobs=tuple(draw(st.lists(F32, min_size=n, max_size=n))),
        weight_versions=tuple(draw(st.lists(st.integers(-1, 9), min_size=n, max_size=n))),
        reward=draw(F32),
        advantage=draw(F32),
        session_weight=draw(F32),
        status=draw(st.sampled_from(["DONE", "TIMEOUT", "FAILED", "CANCELLED"])),
        masked_reason=draw(st.none() | st.text(max_size=8)),
    )


def _as_dict(row: TrajectoryRow) -> dict[str, Any]:
    out: dict[str, Any] = {"trajectory_id": row.trajectory_id}
    for f in dataclasses.fields(row):
        value = getattr(row, f.name)
        out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


@settings(max_examples=100, deadline=None)
@given(batch=st.lists(rows(), max_size=6))
def test_rows_round_trip_through_ipc(batch: list[TrajectoryRow]) -> None:
    table = read_ipc(to_ipc(batch))
    assert table.schema.equals(TRAJECTORY_SCHEMA, check_metadata=True)
    assert trajectory_rows(table) == batch


@settings(max_examples=50, deadline=None)
@given(batch=st.lists(rows(), max_size=6))
def test_bytes_are_those_of_the_schema_built_from_plain_dicts(batch: list[TrajectoryRow]) -> None:
    # Byte compatibility with the batches every producer wrote before rows were typed (dicts + from_pylist).
    plain = pa.Table.from_pylist([_as_dict(r) for r in batch], schema=TRAJECTORY_SCHEMA)
    assert trajectory_table(batch).equals(plain)
    for compression in (None, "zstd"):
        assert to_ipc(batch, compression=compression) == to_ipc(plain, compression=compression)


def _row(**kw: Any) -> TrajectoryRow:
    base: dict[str, Any] = dict(
        session_id="s",
        group_id="g",
        task_id="t",
        harness="pi",
        builder="per_request",
        trace_index=0,
        num_traces=1,
        prompt_len=1,
        tokens=(1, 2, 3),
        loss_mask=(0, 1, 1),
        logprobs=(0.0, -0.5, -0.25),
        weight_versions=(-1, 2, 2),
        reward=1.0,
        advantage=0.5,
        session_weight=1.0,
        status="DONE",
    )
    return TrajectoryRow(**{**base, **kw})


def test_trajectory_id_is_session_and_trace() -> None:
    assert _row(session_id="s-1", trace_index=2, num_traces=3).trajectory_id == "s-1/2"
    assert trajectory_table([_row()]).column("trajectory_id").to_pylist() == ["s/0"]


@pytest.mark.parametrize("column", ["loss_mask", "logprobs", "weight_versions"])
def test_a_per_token_column_of_another_length_is_refused(column: str) -> None:
    with pytest.raises(ValueError, match=rf"trajectory row s/0: {column} has 2 values, tokens has 3"):
        _row(**{column: (0, 0)})


def test_out_of_range_lengths_and_indices_are_refused() -> None:
    with pytest.raises(ValueError, match=r"prompt_len 4 not in \[0, 3\]"):
        _row(prompt_len=4)
    with pytest.raises(ValueError, match=r"prompt_len -1"):
        _row(prompt_len=-1)
    with pytest.raises(ValueError, match=r"trace_index 1 not in \[0, 1\)"):
        _row(trace_index=1)


def test_decoding_a_table_with_a_foreign_trajectory_id_is_an_error() -> None:
    raw = _as_dict(_row())
    raw["trajectory_id"] = "other/0"
    with pytest.raises(DecodeError, match="trajectory_id 'other/0'"):
        trajectory_rows(pa.Table.from_pylist([raw], schema=TRAJECTORY_SCHEMA))
    raw = _as_dict(_row())
    raw["prompt_len"] = 7
    with pytest.raises(DecodeError, match="prompt_len 7"):
        trajectory_rows(pa.Table.from_pylist([raw], schema=TRAJECTORY_SCHEMA))


def test_an_empty_batch_is_a_valid_table() -> None:
    assert trajectory_table([]).num_rows == 0
    assert trajectory_rows(read_ipc(to_ipc([]))) == []
