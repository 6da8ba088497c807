"""Contract tests: golden samples round-trip, versions are checked, invariants hold, the registry is complete."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

import contracts
from contracts import (
    TOPICS,
    TRAJECTORY_SCHEMA,
    VALID_TRANSITIONS,
    DecodeError,
    Event,
    ModelCallRecorded,
    SchemaVersionError,
    SessionFinished,
    SessionState,
    SessionStateChanged,
    TrajectoryBatch,
    TrajectoryRow,
    decode,
    encode,
    read_ipc,
    to_ipc,
    trajectory_table,
)

GOLDEN = Path(__file__).parent / "golden"
EVENT_TYPES: list[type[Event]] = [t.model for t in TOPICS]


def test_every_event_has_a_golden_sample() -> None:
    assert sorted(p.stem for p in GOLDEN.glob("*.json")) == sorted(m.__name__ for m in EVENT_TYPES)


@pytest.mark.parametrize("model", EVENT_TYPES, ids=lambda m: m.__name__)
def test_golden_round_trip(model: type[Event]) -> None:
    raw = (GOLDEN / f"{model.__name__}.json").read_bytes()
    event = decode(model, raw)  # the golden TrajectoryBatch is a claim check, so its JSON is the whole message
    assert json.loads(encode(event)) == json.loads(raw)
    assert decode(model, encode(event)) == event


@pytest.mark.parametrize("model", EVENT_TYPES, ids=lambda m: m.__name__)
def test_newer_schema_version_is_a_typed_error(model: type[Event]) -> None:
    raw = json.loads((GOLDEN / f"{model.__name__}.json").read_text())
    raw["schema_version"] = model.SCHEMA_VERSION + 1
    with pytest.raises(SchemaVersionError):
        decode(model, json.dumps(raw).encode())
    del raw["schema_version"]
    with pytest.raises(SchemaVersionError):
        decode(model, json.dumps(raw).encode())


@pytest.mark.parametrize("model", EVENT_TYPES, ids=lambda m: m.__name__)
def test_events_are_documented_frozen_and_strict(model: type[Event]) -> None:
    doc = model.__doc__ or ""
    assert "Producer" in doc and "Consumer" in doc, f"{model.__name__} docstring must name producer and consumer"
    raw = json.loads((GOLDEN / f"{model.__name__}.json").read_text())
    raw["unexpected_field"] = 1
    with pytest.raises(DecodeError):
        decode(model, json.dumps(raw).encode())
    event = decode(model, (GOLDEN / f"{model.__name__}.json").read_bytes())
    with pytest.raises(Exception, match="frozen"):
        event.schema_version = 2  # type: ignore[misc]


@pytest.mark.parametrize("junk", [b"", b"not json", b"[1,2]", b"\xff\xfe", b"FLOE\x00"])
def test_junk_is_a_decode_error(junk: bytes) -> None:
    with pytest.raises((DecodeError, SchemaVersionError)):
        decode(ModelCallRecorded, junk)


def _call(**kw: object) -> dict[str, object]:
    base: dict[str, object] = json.loads((GOLDEN / "ModelCallRecorded.json").read_text())
    base.update(kw)
    return base


def test_model_call_invariants() -> None:
    ok = ModelCallRecorded.model_validate(_call())
    assert ok.prompt_len == ok.prefix_len + len(ok.prompt_token_ids)
    with pytest.raises(ValueError, match="differ in length"):
        ModelCallRecorded.model_validate(_call(completion_logprobs=[-1.0]))
    with pytest.raises(ValueError, match="prompt_len"):
        ModelCallRecorded.model_validate(_call(prompt_len=99))
    with pytest.raises(ValueError, match="earlier call"):
        ModelCallRecorded.model_validate(_call(prefix_call_index=1))
    with pytest.raises(ValueError, match="supersede itself"):
        ModelCallRecorded.model_validate(_call(supersedes_call_ids=["c-0", _call()["call_id"]]))


def test_state_transitions_follow_the_table() -> None:
    for prev, allowed in VALID_TRANSITIONS.items():
        for state in SessionState:
            kwargs = dict(session_id="s", group_id="g", node_id="n", state=state, previous=prev, seq=1)
            if state in allowed:
                SessionStateChanged(**kwargs)  # type: ignore[arg-type]
            else:
                with pytest.raises(ValueError, match="invalid transition"):
                    SessionStateChanged(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="terminal"):
        SessionFinished(
            session_id="s", group_id="g", task_id="t", harness="pi", node_id="n", status=SessionState.RUNNING
        )


def _rows(n: int, length: int) -> list[TrajectoryRow]:
    return [
        TrajectoryRow(
            session_id=f"s{i}",
            group_id="g",
            task_id="t",
            harness="pi",
            builder="prefix_merging",
            trace_index=0,
            num_traces=1,
            prompt_len=3,
            tokens=tuple(range(length)),
            loss_mask=(0, 0, 0) + (1,) * (length - 3),
            logprobs=(0.0,) * 3 + (-0.5,) * (length - 3),
            weight_versions=(-1,) * 3 + (2,) * (length - 3),
            reward=1.0,
            advantage=0.5,
            session_weight=1.0,
            status="DONE",
        )
        for i in range(n)
    ]


def test_trajectory_batch_inline_arrow_is_framed_and_zero_copy() -> None:
    ipc = to_ipc(_rows(4, 50))
    batch = TrajectoryBatch(
        batch_id="b",
        step=1,
        num_rows=4,
        num_groups=1,
        num_sessions=4,
        builder="prefix_merging",
        min_weight_version=2,
        max_weight_version=2,
        size_bytes=len(ipc),
        arrow_ipc=ipc,
    )
    wire = encode(batch)
    back = decode(TrajectoryBatch, wire)
    assert isinstance(back.arrow_ipc, memoryview)
    assert back.arrow_ipc.obj is wire  # a view into the message, not a copy
    table = read_ipc(back.arrow_ipc)
    assert table.num_rows == 4 and table.schema.equals(TRAJECTORY_SCHEMA)
    assert table.column("tokens")[3].as_py() == list(range(50))


def test_trajectory_batch_needs_exactly_one_payload() -> None:
    kw = dict(
        batch_id="b",
        step=0,
        num_rows=0,
        num_groups=0,
        num_sessions=0,
        builder="x",
        min_weight_version=0,
        max_weight_version=0,
        size_bytes=0,
    )
    with pytest.raises(ValueError, match="exactly one"):
        TrajectoryBatch(**kw)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sha256"):
        TrajectoryBatch(uri="file:///x", **kw)  # type: ignore[arg-type]


def test_misaligned_arrow_tables_are_rejected() -> None:
    # Tables that did not come from TrajectoryRow (another producer, the wire) are checked too.
    raw = trajectory_table(_rows(1, 10)).to_pylist()
    raw[0]["logprobs"] = [0.0]
    with pytest.raises(DecodeError, match="aligned"):
        to_ipc(pa.Table.from_pylist(raw, schema=TRAJECTORY_SCHEMA))
    with pytest.raises(DecodeError):
        read_ipc(b"garbage")
    bad = trajectory_table(_rows(1, 5)).replace_schema_metadata({b"floe.schema_version": b"9"})
    with pytest.raises(SchemaVersionError):
        to_ipc(bad)


def test_topic_registry_is_consistent() -> None:
    names = [t.name for t in TOPICS]
    assert len(names) == len(set(names))
    models = [t.model for t in TOPICS]
    assert len(models) == len(set(models)), "one event type per topic"
    for topic in TOPICS:
        assert topic.key_field in topic.model.model_fields, f"{topic.name}: key {topic.key_field} not a field"
        assert int(topic.config["max.message.bytes"]) >= 1024 * 1024
        assert contracts.topic_by_name(topic.name) is topic
    with pytest.raises(KeyError):
        contracts.topic_by_name("nope")


def test_public_surface_is_curated() -> None:
    exported = set(contracts.__all__)
    public = {name for name in vars(contracts) if not name.startswith("_")} - {
        "advantages",
        "arrays",
        "arrow",
        "codec",
        "errors",
        "events",
        "ids",
        "prompt_delta",
        "providers",
        "request_delta",
        "topics",
    }
    assert exported == public, f"__all__ drifted: {sorted(exported ^ public)}"
