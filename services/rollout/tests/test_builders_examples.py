"""Hand-written sessions whose traces can be checked by eye."""

from __future__ import annotations

import pytest

from contracts import ModelCallRecorded, Protocol, TokenizationMode
from rollout.builders import build_trajectories
from rollout.calls import ReconstructionError, decode_calls, merge_call

EOT = 2


def call(
    i: int,
    prompt: list[int],
    out: list[int],
    finish: str = "stop",
    mode: TokenizationMode = TokenizationMode.CANONICAL,
    prefix: tuple[int, int] | None = None,
    version: int = 0,
) -> ModelCallRecorded:
    prefix_index, prefix_len = prefix if prefix else (None, 0)
    return ModelCallRecorded(
        session_id="s",
        call_index=i,
        call_id=f"c{i}",
        protocol=Protocol.OPENAI_CHAT,
        tokenization=mode,
        model="m",
        weight_version=version,
        prompt_token_ids=prompt,
        prefix_call_index=prefix_index,
        prefix_len=prefix_len,
        prompt_len=prefix_len + len(prompt),
        completion_token_ids=out,
        completion_logprobs=[-0.1 * (k + 1) for k in range(len(out))],
        finish_reason=finish,  # type: ignore[arg-type]
    )


def test_canonical_chain_drops_the_canonical_copy_and_keeps_the_sampled_tokens() -> None:
    # call 0 samples [50, 51, EOT]; the server re-renders it as [55] (re-tokenized) + EOT, then a tool result [60].
    calls = [call(0, [10, 11], [50, 51, EOT]), call(1, [10, 11, 55, EOT, 60, 12], [70, EOT], version=1)]
    r = build_trajectories(calls, "prefix_merging")
    (t,) = r.traces
    assert t.tokens == (10, 11, 50, 51, EOT, 60, 12, 70, EOT)
    assert t.loss_mask == (0, 0, 1, 1, 1, 0, 0, 1, 1)
    assert t.weight_versions == (-1, -1, 0, 0, 0, -1, -1, 1, 1)
    assert r.stats.merged == 1 and r.stats.breaks == 0 and r.stats.masked_tokens == 2


def test_truncated_answer_gets_a_masked_end_of_turn() -> None:
    calls = [
        call(0, [10], [50, EOT]),
        call(1, [10, 50, EOT, 60], [51, 52], finish="length"),
        call(2, [10, 50, EOT, 60, 51, 52, EOT, 61], [53, EOT]),
    ]
    (t,) = build_trajectories(calls, "prefix_merging").traces
    assert t.tokens == (10, 50, EOT, 60, 51, 52, EOT, 61, 53, EOT)
    assert t.loss_mask == (0, 1, 1, 0, 1, 1, 0, 0, 1, 1)  # the inserted EOT after [51, 52] is masked


def test_sub_agent_compaction_and_retry_open_new_chains_and_nothing_is_dropped() -> None:
    calls = [
        call(0, [10, 11], [50, EOT]),
        call(1, [20, 21], [80, EOT]),  # sub-agent: its own chain
        call(2, [10, 11, 50, EOT, 60], [51, EOT]),  # main agent continues chain 0
        call(3, [20, 21, 80, EOT, 90], [81, EOT]),  # sub-agent continues chain 1
        call(4, [10, 99], [52, EOT]),  # compaction: extends nothing
        call(5, [10, 99], [53, EOT]),  # retry of the same prompt: a sibling, not an extension
    ]
    r = build_trajectories(calls, "prefix_merging")
    assert [t.call_indices for t in r.traces] == [(0, 2), (1, 3), (4,), (5,)]
    assert r.stats.unmatched == 4 and r.stats.merged == 2 and r.stats.breaks == 0


def test_failed_chain_check_starts_a_new_chain_with_a_reason() -> None:
    no_eot = [call(0, [10], [50, EOT]), call(1, [10, 50, 60], [51, EOT])]  # canonical tail without end-of-turn
    r = build_trajectories(no_eot, "prefix_merging")
    assert len(r.traces) == 2 and r.stats.break_reasons == {"no_eot_in_tail": 1}
    exact = [
        call(0, [10], [50, EOT], mode=TokenizationMode.EXACT),
        call(1, [10, 55, EOT, 60], [51, EOT], mode=TokenizationMode.EXACT),
    ]  # rewritten last answer
    r = build_trajectories(exact, "prefix_merging")
    assert len(r.traces) == 2 and r.stats.break_reasons == {"exact_not_extended": 1}


def test_delta_encoded_prompts_are_decoded_and_checked() -> None:
    calls = [call(0, [10, 11], [50, EOT]), call(1, [60], [51], prefix=(0, 4))]
    decoded = decode_calls(reversed(calls))
    assert decoded[1].prompt == (10, 11, 50, EOT, 60)
    with pytest.raises(ReconstructionError, match="not recorded"):
        decode_calls([calls[1]])
    with pytest.raises(ReconstructionError, match="exceeds"):
        decode_calls([calls[0], call(1, [60], [51], prefix=(0, 9))])
    with pytest.raises(ReconstructionError, match="different call_id"):
        decode_calls([calls[0], calls[0].model_copy(update={"call_id": "other"})])
    assert decode_calls([calls[0], calls[0]]) == decode_calls([calls[0]])  # redelivery collapses
    with pytest.raises(KeyError, match="unknown builder"):
        build_trajectories(calls, "nope")


def test_a_call_replaces_the_attempts_it_supersedes_in_any_order() -> None:
    first, second = call(0, [10, 11], [50, EOT]), call(1, [60], [51], prefix=(0, 4))
    # Two attempts at call 0 whose records were not acknowledged but landed, then the one the harness got.
    a = call(0, [10, 11], [90, EOT]).model_copy(update={"call_id": "a"})
    b = call(0, [10, 11], [91, EOT]).model_copy(update={"call_id": "b", "supersedes_call_ids": ["a"]})
    kept = first.model_copy(update={"supersedes_call_ids": ["a", "b"]})
    expected = decode_calls([first, second])
    for order in ([a, b, kept, second], [kept, b, a, second], [b, a, kept, second], [second, a, kept, b, a]):
        decoded = decode_calls(order)
        assert [d.sequence for d in decoded] == [d.sequence for d in expected]
        assert decoded[0].call_id == "c0"
    by_index: dict[int, ModelCallRecorded] = {0: first}
    with pytest.raises(ReconstructionError, match="different call_id"):
        merge_call(by_index, a)  # supersedes nothing and is not superseded: a conflict, and nothing changes
    assert by_index == {0: first}
