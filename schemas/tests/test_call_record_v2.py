"""``ModelCallRecorded`` v2: compact arrays and delta-encoded requests round-trip exactly, and v1 records still read.

The v1 golden session (``golden/v1/model_calls.jsonl``) was recorded by the v1 gateway (commit 5e7f68a) against the
CPU engine: 4 exact-mode and 4 canonical-mode calls with tools. ``model_calls.expected.json`` holds the full prompts
and requests the v1 decoder gave for it at the time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts import (
    MODEL_CALLS,
    ModelCallRecorded,
    Protocol,
    RequestDeltaError,
    TokenizationMode,
    decode,
    decode_prompts,
    decode_requests,
    encode,
    encode_request,
)
from contracts.arrays import decode_floats, decode_ints, encode_floats, encode_ints

GOLDEN = Path(__file__).parent / "golden"


# ------------------------------------------------------------------------------------------------------ arrays


@given(st.lists(st.integers(0, 2**32 - 1), max_size=50))
def test_token_ids_round_trip_exactly(ids: list[int]) -> None:
    text = encode_ints(ids)
    assert decode_ints(text) == ids
    assert text.startswith("u2:" if not ids or max(ids) < 2**16 else "u4:")


@given(st.lists(st.floats(allow_nan=False, width=64), max_size=50))
def test_logprobs_round_trip_exactly(values: list[float]) -> None:
    assert decode_floats(encode_floats(values)) == values


def test_logprobs_take_the_narrow_form_only_when_it_is_lossless() -> None:
    assert encode_floats([-0.25, -1.5, float("-inf")]).startswith("f4:")
    exact64 = [-0.1]  # not a float32 value
    assert encode_floats(exact64).startswith("f8:") and decode_floats(encode_floats(exact64)) == exact64
    nan = decode_floats(encode_floats([float("nan")]))
    assert nan[0] != nan[0]


def test_bad_arrays_are_refused() -> None:
    with pytest.raises(ValueError, match="token ids must be in"):
        encode_ints([-1])
    with pytest.raises(ValueError, match="unknown encoding"):
        decode_ints("u8:AAAA")
    with pytest.raises(ValueError, match="not a"):
        decode_ints("u2:!!!")
    assert decode_ints([1, 2]) == [1, 2]  # v1 lists pass through to pydantic


# ----------------------------------------------------------------------------------------------- request delta


def _call(index: int, full: dict[str, Any], base: tuple[int, dict[str, Any]] | None) -> ModelCallRecorded:
    delta = encode_request(full, base)
    return ModelCallRecorded(
        session_id="s-1",
        call_index=index,
        call_id=f"c-{index}",
        protocol=Protocol.OPENAI_CHAT,
        tokenization=TokenizationMode.EXACT,
        model="m",
        weight_version=0,
        prompt_token_ids=[],
        prompt_len=0,
        completion_token_ids=[],
        completion_logprobs=[],
        finish_reason="stop",
        request=delta.request,
        request_base_call_index=delta.base_call_index,
        request_messages_prefix=delta.messages_prefix,
        request_same=list(delta.same),
    )


MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": st.sampled_from("abc")})


@st.composite
def requests(draw: st.DrawFn) -> list[tuple[dict[str, Any], int | None]]:
    """Full requests of a session, each extending, cutting or replacing an earlier one's messages, with fields that
    stay, change, appear and disappear; and the base each is encoded against (None: whole)."""
    out: list[tuple[dict[str, Any], int | None]] = []
    for i in range(draw(st.integers(1, 6))):
        base = draw(st.none() | st.integers(0, i - 1)) if i else None
        old = out[base][0]["messages"] if base is not None and "messages" in out[base][0] else []
        keep = draw(st.integers(0, len(old)))
        full: dict[str, Any] = {"messages": old[:keep] + draw(st.lists(MESSAGE, max_size=3))}
        if draw(st.booleans()):
            full["tools"] = draw(st.sampled_from([["bash"], ["bash", "edit"]]))
        if draw(st.booleans()):
            full["max_tokens"] = draw(st.sampled_from([16, 32]))
        if draw(st.booleans()):
            del full["messages"]
        out.append((full, base))
    return out


@settings(max_examples=200)
@given(requests())
def test_requests_round_trip_through_the_wire(session: list[tuple[dict[str, Any], int | None]]) -> None:
    calls = [
        _call(i, full, None if base is None else (base, session[base][0])) for i, (full, base) in enumerate(session)
    ]
    wire = [decode(ModelCallRecorded, encode(c)) for c in calls]
    assert decode_requests(wire) == [full for full, _ in session]


def test_a_longer_session_sends_only_what_is_new() -> None:
    tools = [{"name": "bash", "description": "x" * 500}]
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "s" * 500}]
    calls, prev = [], None
    for i in range(4):
        msgs = [*msgs, {"role": "user", "content": f"turn {i}"}]
        full = {"messages": msgs, "tools": tools, "max_tokens": 8}
        calls.append(_call(i, full, prev))
        prev = (i, full)
        msgs = [*msgs, {"role": "assistant", "content": "ok"}]
    last = calls[-1]
    assert last.request == {"messages": [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "turn 3"}]}
    assert last.request_messages_prefix == 6 and sorted(last.request_same) == ["max_tokens", "tools"]


def test_a_request_that_cannot_be_rebuilt_is_a_typed_error() -> None:
    first = _call(0, {"messages": [{"role": "user", "content": "a"}], "tools": ["bash"]}, None)
    second = _call(
        1,
        {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]},
        (
            0,
            {
                "messages": [{"role": "user", "content": "a"}],
                "tools": ["bash"],
            },
        ),
    )
    with pytest.raises(RequestDeltaError, match="refers to request of call 0, which was not recorded"):
        decode_requests([second])
    short = second.model_copy(update={"request_messages_prefix": 5})
    with pytest.raises(RequestDeltaError, match="request_messages_prefix 5 exceeds the 1 messages"):
        decode_requests([first, short])
    ghost = second.model_copy(update={"request_same": ["temperature"]})
    with pytest.raises(RequestDeltaError, match=r"fields \['temperature'\] are not in the base request"):
        decode_requests([first, ghost])
    with pytest.raises(ValueError, match="request_base_call_index must name an earlier call"):
        _call(0, {"messages": []}, (0, {"messages": []}))
    raw = json.loads(first.model_dump_json())
    raw["request_same"] = ["tools"]
    with pytest.raises(Exception, match="without request_base_call_index"):
        ModelCallRecorded.model_validate(raw)


# ---------------------------------------------------------------------------------------------- v1 still reads


def test_v1_golden_record_reads_as_the_same_call() -> None:
    v1 = json.loads((GOLDEN / "v1" / "ModelCallRecorded.json").read_text())
    call = decode(ModelCallRecorded, json.dumps(v1).encode())
    assert call.schema_version == 4 and call.request_base_call_index is None and call.group_id == ""
    for field in ("prompt_token_ids", "completion_token_ids", "completion_logprobs", "request", "prefix_len"):
        assert getattr(call, field) == v1[field], field
    # The same record through model_validate (how `floe replay` reads JSONL) and re-encoded as v2.
    assert ModelCallRecorded.model_validate(v1) == call
    assert decode(ModelCallRecorded, encode(call)) == call


def test_v2_golden_record_reads_as_a_current_call_without_a_group() -> None:
    v2 = json.loads((GOLDEN / "v2" / "ModelCallRecorded.json").read_text())
    assert v2["schema_version"] == 2 and "group_id" not in v2
    call = decode(ModelCallRecorded, json.dumps(v2).encode())
    assert call.schema_version == 4 and call.group_id == "" and call.supersedes_call_ids == []
    for field in ("prompt_token_ids", "completion_token_ids", "completion_logprobs", "request", "session_id"):
        assert getattr(call, field) == ModelCallRecorded.model_validate(v2).model_dump()[field], field
    # Without a group id the topic keys it by its session, as v2 did.
    assert MODEL_CALLS.key_of(call) == call.session_id.encode()
    assert MODEL_CALLS.key_of(call.model_copy(update={"group_id": "g-1"})) == b"g-1"


def test_v3_golden_record_reads_as_a_current_call_that_supersedes_nothing() -> None:
    v3 = json.loads((GOLDEN / "v3" / "ModelCallRecorded.json").read_text())
    assert v3["schema_version"] == 3 and "supersedes_call_ids" not in v3
    call = decode(ModelCallRecorded, json.dumps(v3).encode())
    assert call.schema_version == 4 and call.supersedes_call_ids == [] and call.group_id == v3["group_id"]
    current = json.loads((GOLDEN / "ModelCallRecorded.json").read_text())
    # Today's golden record is the v3 one plus the new field: every other field reads the same.
    assert call == decode(ModelCallRecorded, json.dumps(current).encode()).model_copy(
        update={"supersedes_call_ids": []}
    )


def test_v1_session_recorded_by_the_v1_gateway_decodes_as_it_did() -> None:
    lines = (GOLDEN / "v1" / "model_calls.jsonl").read_bytes().splitlines()
    expected = json.loads((GOLDEN / "v1" / "model_calls.expected.json").read_text())
    calls = [decode(ModelCallRecorded, line) for line in lines if line]
    assert all(json.loads(line)["schema_version"] == 1 for line in lines if line)
    assert {c.session_id for c in calls} == set(expected)
    for sid, want in expected.items():
        session = sorted((c for c in calls if c.session_id == sid), key=lambda c: c.call_index)
        assert len(session) == 4
        assert [list(p) for p in decode_prompts(session)] == want["prompts"]
        assert decode_requests(session) == want["requests"]
        # Re-encoded as v2 (whole requests: a v1 record names no base), the session decodes the same again.
        again = [decode(ModelCallRecorded, encode(c)) for c in session]
        assert decode_requests(again) == want["requests"]
        assert [list(p) for p in decode_prompts(again)] == want["prompts"]
