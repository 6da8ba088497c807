"""The prompt delta encoding of ``ModelCallRecorded``: decode(encode(session)) == session, through the wire."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts import (
    ModelCallRecorded,
    PromptDelta,
    PromptDeltaError,
    Protocol,
    TokenizationMode,
    decode,
    decode_prompt,
    decode_prompts,
    encode,
    encode_prompt,
)

GOLDEN = Path(__file__).parent / "golden"

# A tiny alphabet, so prompts often share prefixes with earlier sequences by accident too, not only by construction.
TOKENS = st.integers(0, 3)


@st.composite
def sessions(draw: st.DrawFn) -> list[tuple[list[int], list[int]]]:
    """(prompt, completion) per call: each prompt is fresh, or a cut of an earlier call's sequence plus a tail."""
    calls: list[tuple[list[int], list[int]]] = []
    for _ in range(draw(st.integers(1, 8))):
        tail = draw(st.lists(TOKENS, max_size=6))
        extend: bool = draw(st.booleans())
        if calls and extend:
            prompt, completion = calls[draw(st.integers(0, len(calls) - 1))]
            sequence = prompt + completion
            prompt = sequence[: draw(st.integers(0, len(sequence)))] + tail
        else:
            prompt = tail
        calls.append((prompt, draw(st.lists(TOKENS, max_size=4))))
    return calls


def _record(index: int, delta: PromptDelta, completion: Sequence[int]) -> ModelCallRecorded:
    return ModelCallRecorded(
        session_id="s",
        call_index=index,
        call_id=f"s-{index}",
        protocol=Protocol.OPENAI_CHAT,
        tokenization=TokenizationMode.EXACT,
        model="m",
        weight_version=0,
        prompt_token_ids=list(delta.tail),
        prefix_call_index=delta.prefix_call_index,
        prefix_len=delta.prefix_len,
        prompt_len=delta.prompt_len,
        completion_token_ids=list(completion),
        completion_logprobs=[-0.5] * len(completion),
        finish_reason="stop",
    )


def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _through_the_wire(records: list[ModelCallRecorded]) -> list[ModelCallRecorded]:
    return [decode(ModelCallRecorded, encode(r)) for r in records]


@settings(max_examples=300, deadline=None)
@given(calls=sessions(), history=st.integers(1, 8))
def test_gateway_encoding_round_trips(calls: list[tuple[list[int], list[int]]], history: int) -> None:
    # The gateway offers only its last `history` calls (exact_history): whatever it references must decode.
    records = []
    sequences: list[tuple[int, list[int]]] = []
    for index, (prompt, completion) in enumerate(calls):
        bases = sequences[-history:]
        delta = encode_prompt(prompt, bases)
        # Longest shared prefix among the bases offered; ties go to the latest call; nothing shared, no reference.
        best = max((_lcp(seq, prompt) for _, seq in bases), default=0)
        assert delta.prefix_len == best
        if best == 0:
            assert delta.prefix_call_index is None
        else:
            assert delta.prefix_call_index == max(i for i, seq in bases if _lcp(seq, prompt) == best)
        records.append(_record(index, delta, completion))
        sequences.append((index, prompt + completion))
    assert [list(p) for p in decode_prompts(_through_the_wire(records))] == [p for p, _ in calls]


@settings(max_examples=300, deadline=None)
@given(calls=sessions(), data=st.data())
def test_any_valid_reference_decodes(calls: list[tuple[list[int], list[int]]], data: st.DataObject) -> None:
    # A decoder must not depend on the gateway's choice of base: reference any earlier call, any shared length.
    records = []
    sequences: list[list[int]] = []
    for index, (prompt, completion) in enumerate(calls):
        base = data.draw(st.none() | st.integers(0, index - 1)) if index else None
        if base is None:
            delta = PromptDelta(None, 0, tuple(prompt))
        else:
            n = data.draw(st.integers(0, _lcp(sequences[base], prompt)))
            delta = PromptDelta(base, n, tuple(prompt[n:]))
        records.append(_record(index, delta, completion))
        sequences.append(prompt + completion)
    assert [list(p) for p in decode_prompts(_through_the_wire(records))] == [p for p, _ in calls]


def test_first_call_and_empty_prompts() -> None:
    assert encode_prompt([5, 6], []) == PromptDelta(None, 0, (5, 6))
    assert encode_prompt([], [(0, [1, 2])]) == PromptDelta(None, 0, ())
    assert encode_prompt([7, 8], [(0, [1, 2])]) == PromptDelta(None, 0, (7, 8))  # nothing shared: no reference
    # A prompt that is exactly an earlier sequence has an empty tail.
    assert encode_prompt([1, 2], [(0, [1, 2])]) == PromptDelta(0, 2, ())
    first = _record(0, encode_prompt([], []), [3])
    second = _record(1, encode_prompt([3, 4], [(0, [3])]), [])
    assert second.prefix_call_index == 0 and second.prefix_len == 1
    assert decode_prompts([first, second]) == [(), (3, 4)]


def test_ties_go_to_the_latest_call_in_any_order() -> None:
    bases = [(2, [1, 2, 9]), (0, [1, 2, 3]), (1, [1, 2])]
    assert encode_prompt([1, 2, 5], bases) == PromptDelta(2, 2, (5,))


def test_golden_sample_decodes_against_its_base() -> None:
    call = decode(ModelCallRecorded, (GOLDEN / "ModelCallRecorded.json").read_bytes())
    assert decode_prompt(call, {0: [1, 2, 3, 4, 5, 6]}) == (1, 2, 3, 4, 5, 12, 900, 901)


def test_a_reference_that_cannot_be_followed_is_a_typed_error() -> None:
    first = _record(0, PromptDelta(None, 0, (1, 2)), [3])
    orphan = _record(1, PromptDelta(0, 2, (4,)), [])
    with pytest.raises(PromptDeltaError, match="refers to prefix call 0, which was not recorded"):
        decode_prompts([orphan])
    too_long = _record(1, PromptDelta(0, 4, ()), [])
    with pytest.raises(PromptDeltaError, match="prefix_len 4 exceeds call 0's sequence length 3"):
        decode_prompts([first, too_long])
    # The event refuses a wrong prompt_len itself; a model_construct'ed one is caught on decode.
    raw = json.loads(first.model_dump_json())
    lying = ModelCallRecorded.model_construct(**{**raw, "prompt_len": 9})
    with pytest.raises(PromptDeltaError, match="prompt_len says 9"):
        decode_prompt(lying, {})


@pytest.mark.parametrize("differ_at", [0, 1, 15, 16, 17, 4095, 4096, 4097, 8191, 9000, 9999, None])
@pytest.mark.parametrize("kinds", [(list, list), (tuple, list), (list, tuple)])
def test_the_shared_prefix_is_found_wherever_the_sequences_part(
    differ_at: int | None, kinds: tuple[type, type]
) -> None:
    # encode_prompt compares long sequences a chunk at a time; the first difference must be found exactly, at and
    # around the chunk's edges, whatever kinds of sequence the caller holds.
    base = [(7 * i) % 101 for i in range(10_000)]
    prompt = [*base, 5, 6]
    if differ_at is not None:
        prompt[differ_at] = 1000
    delta = encode_prompt(kinds[1](prompt), [(3, kinds[0](base))])
    shared = 10_000 if differ_at is None else differ_at
    assert (delta.prefix_call_index, delta.prefix_len) == ((3, shared) if shared else (None, 0))
    assert delta.tail == tuple(prompt[shared:])


def test_a_longer_shared_prefix_wins_over_a_later_call_and_ties_go_to_the_latest() -> None:
    prompt = [1, 2, 3, 4, 5]
    assert encode_prompt(prompt, [(0, [1, 2, 3, 4]), (5, [1, 2, 9])]).prefix_call_index == 0
    assert encode_prompt(prompt, [(5, [1, 2, 9]), (0, [1, 2, 3, 4])]).prefix_call_index == 0
    assert encode_prompt(prompt, [(2, [1, 2, 3]), (4, [1, 2, 3, 7, 7]), (3, [1, 2, 3])]).prefix_call_index == 4
    assert encode_prompt(prompt, [(2, [9]), (4, [8])]).prefix_call_index is None


class _Unreadable(Sequence[int]):
    """A base that fails the test if it is compared."""

    def __init__(self, n: int) -> None:
        self._n = n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: object) -> int:  # type: ignore[override]
        raise AssertionError("an earlier base was compared after the whole prompt had been found")


def test_once_the_whole_prompt_is_shared_no_other_base_is_read() -> None:
    # A retried or repeated call: its prompt is all in the latest call's sequence, so older (even longer) bases
    # cannot share more, and comparing each of them cost the gateway a pass over the prompt per base.
    prompt = [1, 2, 3]
    assert encode_prompt(prompt, [(0, _Unreadable(10)), (1, [1, 2, 3, 4])]) == PromptDelta(1, 3, ())
